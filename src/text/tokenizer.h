// Byte-level BPE tokenizer (GGUF tokenizer.ggml.model = "gpt2": SmolLM2,
// Llama 3, Qwen2, GPT-2), matching HF `tokenizers` token for token.
//
// encode(text):
//   1. added tokens (CONTROL and USER_DEFINED) are cut out of the raw text,
//      longest match first, leftmost first;
//   2. the text between them is split into pieces by the family's
//      pre-tokenizer (unicode_split.h);
//   3. each piece's bytes start as one symbol per byte (GPT-2's byte-to-
//      unicode alphabet) and are merged by merge rank, lowest rank first and
//      leftmost first among equals. Merges never produce an added token.
// decode(ids) concatenates the tokens' bytes; a normal token's text is in the
// byte alphabet ("Ġthe" = " the"), an added token's text is itself.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/unicode_split.h"

namespace ferry::gguf {
class File;
}

namespace ferry::text {

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerSpec {
  // Token strings as GGUF stores them: normal tokens in the byte alphabet,
  // added tokens as their literal text.
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // TokenType per token; empty: all normal
  std::vector<std::string> merges;   // "left right", highest priority first
  std::string pre = "default";       // tokenizer.ggml.pre (the family)
  int32_t bos = -1, eos = -1, pad = -1;
  int32_t eot = -1;  // end of turn (<|im_end|>, <|eot_id|>), when the model has one
  bool add_bos = false;
};

class Tokenizer {
 public:
  // Reads the tokenizer.ggml.* keys. When the file names no end-of-turn
  // token, a control token named like one (<|im_end|>, <|eot_id|>, ...) is
  // taken. Throws ferry::Error for a model other than gpt2.
  static TokenizerSpec spec_from_gguf(const gguf::File& file);
  // Validates the spec (ids in range, merges over known tokens, a supported
  // pre-tokenizer) and builds the lookup tables. Throws ferry::Error.
  static std::unique_ptr<Tokenizer> from_spec(TokenizerSpec spec);
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);

  // Never adds BOS: callers prepend bos() when add_bos() says so (a chat
  // template usually writes it itself). With parse_special false, control
  // tokens in the text are encoded as plain text; user-defined tokens are
  // still matched (as HF and llama.cpp do). Any bytes are accepted; ill-
  // formed UTF-8 is encoded byte by byte. Thread-safe (const, no cache).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Concatenated token bytes with ill-formed UTF-8 (a character cut off
  // between token runs) replaced by U+FFFD, so the result is always valid
  // UTF-8. skip_special drops control tokens. Throws on an id out of range.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes of a token (possibly part of a UTF-8 character).
  const std::string& token_bytes(int32_t id) const;
  // The token as the vocabulary spells it ("Ġthe", "<|im_start|>").
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Looks up a token by its vocabulary spelling (see token_text).
  std::optional<int32_t> find(std::string_view token) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos() const { return bos_; }  // -1: none
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  PreTokenizer pre_tokenizer() const { return pre_; }
  // eos, eot, and the control tokens that end a generation in the known
  // templates (<|endoftext|>, <|im_end|>, <|eot_id|>, <|eom_id|>, ...).
  bool is_end_of_generation(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  struct Scratch;

  Tokenizer() = default;
  // Parts of from_spec, in this order; the special ids are set before.
  void init_vocab(std::vector<std::string> tokens, const std::vector<int32_t>& types);
  void init_merges(const std::vector<std::string>& merges);
  void init_added();  // the added-token index and the end-of-generation set
  void check_id(int32_t id) const;
  // Longest added token at text[pos..], or nullopt.
  std::optional<int32_t> match_added(std::string_view text, size_t pos, bool parse_special) const;
  void encode_plain(std::string_view text, Scratch& s, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, Scratch& s, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<std::string> bytes_;  // decoded bytes of each token
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> vocab_;
  std::array<int32_t, 256> byte_ids_{};         // token of each single byte, -1 if none
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  // Added tokens to match, bucketed by first byte, longest first.
  std::array<std::vector<int32_t>, 256> added_;
  std::vector<int32_t> eog_;
  PreTokenizer pre_ = PreTokenizer::kGpt2;
  // Llama 3 (HF ignore_merges): a piece that is a whole token is that token,
  // even where merging would not reach it.
  bool ignore_merges_ = false;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, pad_ = -1;
  bool add_bos_ = false;
};

// Turns a stream of token ids into text piece by piece: push() returns only
// whole UTF-8 characters and holds back the start of one that continues in
// a later token. Everything push() and flush() return, concatenated, equals
// tokenizer.decode(all ids) for the same skip_special.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  // Returns what is held back (an unfinished character becomes U+FFFD) and
  // resets the decoder.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // at most 3 bytes of an unfinished character
};

}  // namespace ferry::text
