#include "text/tokenizer.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"
#include "text/unicode.h"

namespace ferry::text {

namespace {

// GPT-2's byte-to-unicode alphabet: the printable bytes ! .. ~, ¡ .. ¬ and
// ® .. ÿ stand for themselves; the other 68 bytes, in byte order, become
// U+0100 .. U+0143 (so space is U+0120 'Ġ' and newline U+010A 'Ċ').
struct ByteAlphabet {
  std::array<char32_t, 256> cp_of_byte;
  std::array<int16_t, 0x144> byte_of_cp;  // -1: not in the alphabet

  ByteAlphabet() {
    byte_of_cp.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cp_of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The bytes a normal token stands for. A code point outside the alphabet
// (not expected in a byte-level vocabulary) is kept as its own UTF-8, as
// HF's ByteLevel decoder does.
std::string token_to_bytes(std::string_view token) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const Utf8Unit u = utf8_decode(token.substr(i));
    if (u.status == Utf8Unit::kValid && u.cp < a.byte_of_cp.size() && a.byte_of_cp[u.cp] >= 0) {
      out += static_cast<char>(a.byte_of_cp[u.cp]);
    } else {
      out.append(token.substr(i, u.len));
    }
    i += u.len;
  }
  return out;
}

std::optional<PreTokenizer> pre_tokenizer_by_name(std::string_view name) {
  if (name.empty() || name == "default" || name == "gpt2" || name == "gpt-2") {
    return PreTokenizer::kGpt2;
  }
  if (name == "smollm") return PreTokenizer::kSmolLM;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return PreTokenizer::kLlama3;
  if (name == "qwen2") return PreTokenizer::kQwen2;
  return std::nullopt;
}

bool is_added(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined;
}

// Control tokens that end a turn or a document in the chat templates of the
// byte-level families (and the common SentencePiece one, </s>).
constexpr std::string_view kEndOfTurnNames[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>",
                                                "<|end|>"};
constexpr std::string_view kEndOfGenerationNames[] = {
    "<|im_end|>",    "<|eot_id|>",      "<|eom_id|>", "<end_of_turn>", "<|end|>",
    "<|endoftext|>", "<|end_of_text|>", "</s>",       "<|return|>",    "<|call|>"};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// ---------------------------------------------------------------- building

TokenizerSpec Tokenizer::spec_from_gguf(const gguf::File& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail("tokenizer", f.path(), ": unsupported tokenizer.ggml.model '", model,
         "' (only byte-level BPE, 'gpt2', is supported)");
  }
  TokenizerSpec spec;
  spec.pre = f.get_string("tokenizer.ggml.pre", std::string("default"));
  spec.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.find("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      if (t < 0 || t > static_cast<int64_t>(TokenType::kByte)) {
        fail("tokenizer", f.path(), ": tokenizer.ggml.token_type has unknown type ", t);
      }
      spec.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  spec.merges = f.get_string_array("tokenizer.ggml.merges");
  auto id = [&](const char* key) -> int32_t {
    const int64_t v = f.get_int(key, -1);
    if (v < -1 || v >= static_cast<int64_t>(spec.tokens.size())) {
      fail("tokenizer", f.path(), ": ", key, " = ", v, " is not a token id (vocabulary of ",
           spec.tokens.size(), ")");
    }
    return static_cast<int32_t>(v);
  };
  spec.bos = id("tokenizer.ggml.bos_token_id");
  spec.eos = id("tokenizer.ggml.eos_token_id");
  spec.eot = id("tokenizer.ggml.eot_token_id");
  spec.pad = id("tokenizer.ggml.padding_token_id");
  spec.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  if (spec.eot < 0 && spec.token_types.size() == spec.tokens.size()) {
    for (size_t i = 0; i < spec.tokens.size() && spec.eot < 0; ++i) {
      if (spec.token_types[i] != static_cast<int32_t>(TokenType::kControl)) continue;
      for (std::string_view name : kEndOfTurnNames) {
        if (spec.tokens[i] == name) spec.eot = static_cast<int32_t>(i);
      }
    }
  }
  return spec;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
  return from_spec(spec_from_gguf(file));
}

std::unique_ptr<Tokenizer> Tokenizer::from_spec(TokenizerSpec spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) fail("tokenizer", "empty vocabulary");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail("tokenizer", "vocabulary of ", n, " tokens is too large");
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    fail("tokenizer", spec.token_types.size(), " token types for ", n, " tokens");
  }
  const std::optional<PreTokenizer> pre = pre_tokenizer_by_name(spec.pre);
  if (!pre) {
    fail("tokenizer", "unsupported pre-tokenizer tokenizer.ggml.pre = '", spec.pre,
         "' (supported: default, gpt2, smollm, llama-bpe, qwen2)");
  }
  for (auto [name, v] : {std::pair{"bos", spec.bos}, std::pair{"eos", spec.eos},
                         std::pair{"eot", spec.eot}, std::pair{"pad", spec.pad}}) {
    if (v < -1 || v >= static_cast<int64_t>(n)) {
      fail("tokenizer", name, " id ", v, " out of range [0, ", n, ")");
    }
  }

  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  t->pre_ = *pre;
  t->ignore_merges_ = *pre == PreTokenizer::kLlama3;
  t->bos_ = spec.bos, t->eos_ = spec.eos, t->eot_ = spec.eot, t->pad_ = spec.pad;
  t->add_bos_ = spec.add_bos;
  t->init_vocab(std::move(spec.tokens), spec.token_types);
  t->init_merges(spec.merges);
  t->init_added();
  return t;
}

void Tokenizer::init_vocab(std::vector<std::string> tokens, const std::vector<int32_t>& types) {
  const size_t n = tokens.size();
  types_.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] < 0 || types[i] > static_cast<int32_t>(TokenType::kByte)) {
      fail("tokenizer", "token ", i, " has unknown type ", types[i]);
    }
    types_[i] = static_cast<TokenType>(types[i]);
  }
  if (types.empty()) {  // then at least the named ids are control tokens
    for (int32_t v : {bos_, eos_, eot_, pad_}) {
      if (v >= 0) types_[v] = TokenType::kControl;
    }
  }

  tokens_ = std::move(tokens);
  bytes_.resize(n);
  vocab_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = types_[i];
    const bool literal = is_added(ty) || ty == TokenType::kUnknown || ty == TokenType::kUnused;
    bytes_[i] = literal ? tokens_[i] : token_to_bytes(tokens_[i]);
    vocab_.emplace(tokens_[i], static_cast<int32_t>(i));  // the first of duplicates wins
  }

  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, alphabet().cp_of_byte[b]);
    auto it = vocab_.find(s);
    if (it != vocab_.end() && !is_added(types_[it->second])) byte_ids_[b] = it->second;
  }
}

void Tokenizer::init_merges(const std::vector<std::string>& merges) {
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos) {
      fail("tokenizer", "merge ", r, " '", m, "' is not two tokens separated by one space");
    }
    const std::string merged = std::string(m.substr(0, sp)).append(m.substr(sp + 1));
    int32_t ids[3];
    const std::string_view parts[3] = {m.substr(0, sp), m.substr(sp + 1), merged};
    for (int k = 0; k < 3; ++k) {
      auto it = vocab_.find(parts[k]);
      if (it == vocab_.end()) {
        fail("tokenizer", "merge ", r, " '", m, "': '", parts[k], "' is not in the vocabulary");
      }
      ids[k] = it->second;
    }
    if (is_added(types_[ids[2]])) continue;  // BPE never produces an added token
    merges_.emplace(pair_key(ids[0], ids[1]), Merge{static_cast<int32_t>(r), ids[2]});
  }
}

void Tokenizer::init_added() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (is_added(types_[i]) && !tokens_[i].empty()) {
      added_[static_cast<uint8_t>(tokens_[i][0])].push_back(static_cast<int32_t>(i));
    }
  }
  for (auto& bucket : added_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](int32_t x, int32_t y) { return tokens_[x].size() > tokens_[y].size(); });
  }

  for (int32_t v : {eos_, eot_}) {
    if (v >= 0) eog_.push_back(v);
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (types_[i] != TokenType::kControl) continue;
    for (std::string_view name : kEndOfGenerationNames) {
      if (tokens_[i] == name) eog_.push_back(static_cast<int32_t>(i));
    }
  }
}

// ---------------------------------------------------------------- encoding

// Reused buffers of one encode() call.
struct Tokenizer::Scratch {
  std::vector<ByteSpan> pieces;
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  // A possible merge of symbols[left] with its right neighbour, valid while
  // both still carry the ids it was made from.
  struct Candidate {
    int32_t rank, left, left_id, right_id, merged_id;
    // Heap order: lowest rank first, then leftmost (HF BPE's order).
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Candidate> heap;
  std::string spelled;
};

std::optional<int32_t> Tokenizer::match_added(std::string_view text, size_t pos,
                                              bool parse_special) const {
  for (int32_t id : added_[static_cast<uint8_t>(text[pos])]) {
    if (!parse_special && types_[id] == TokenType::kControl) continue;
    if (text.substr(pos).starts_with(tokens_[id])) return id;
  }
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  Scratch s;
  size_t plain = 0;  // start of the text not yet encoded
  for (size_t i = 0; i < text.size();) {
    const std::optional<int32_t> id = match_added(text, i, parse_special);
    if (!id) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain, i - plain), s, out);
    out.push_back(*id);
    i += tokens_[*id].size();
    plain = i;
  }
  encode_plain(text.substr(plain), s, out);
  return out;
}

void Tokenizer::encode_plain(std::string_view text, Scratch& s, std::vector<int32_t>& out) const {
  s.pieces.clear();
  pretokenize(pre_, text, s.pieces);
  for (const ByteSpan& p : s.pieces) encode_piece(text.substr(p.begin, p.end - p.begin), s, out);
}

// BPE of one piece: O(m log m) in its length m.
void Tokenizer::encode_piece(std::string_view piece, Scratch& s, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges_) {
    s.spelled.clear();
    for (char c : piece) utf8_append(s.spelled, alphabet().cp_of_byte[static_cast<uint8_t>(c)]);
    auto it = vocab_.find(s.spelled);
    if (it != vocab_.end() && !is_added(types_[it->second])) {
      out.push_back(it->second);
      return;
    }
  }
  // A byte without a token is dropped, as HF's BPE does without an unknown
  // token; byte-level vocabularies have all 256.
  auto& sym = s.symbols;
  sym.clear();
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto k = static_cast<int32_t>(sym.size());
    sym.push_back({id, k - 1, k + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  s.heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it == merges_.end()) return;
    s.heap.push_back({it->second.rank, left, sym[left].id, sym[right].id, it->second.id});
    std::push_heap(s.heap.begin(), s.heap.end());
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(sym.size()); ++k) consider(k);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const Scratch::Candidate c = s.heap.back();
    s.heap.pop_back();
    Scratch::Symbol& l = sym[c.left];
    // Stale when either side has changed since: ids only grow by merging, so
    // equal ids mean the same two symbols are still neighbours.
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;
    Scratch::Symbol& r = sym[l.next];
    l.id = c.merged_id;
    r.id = -1;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

// ---------------------------------------------------------------- decoding

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("tokenizer", "token id ", id, " out of range [0, ", vocab_size(), ")");
  }
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return tokens_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

std::optional<int32_t> Tokenizer::find(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

namespace {
bool skipped(const Tokenizer& t, int32_t id, bool skip_special) {
  if (!skip_special) return false;
  const TokenType ty = t.token_type(id);
  return ty == TokenType::kControl || ty == TokenType::kUnknown || ty == TokenType::kUnused;
}
}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (!skipped(*this, id, skip_special)) raw += token_bytes(id);
  }
  std::string out;
  out.reserve(raw.size());
  utf8_append_lossy(out, raw, /*final=*/true);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (!skipped(tok_, id, skip_special_)) pending_ += tok_.token_bytes(id);
  std::string out;
  const size_t used = utf8_append_lossy(out, pending_, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_append_lossy(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace ferry::text
