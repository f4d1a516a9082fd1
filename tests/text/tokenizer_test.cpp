// Tokenizer tests. The golden suite compares with HF `tokenizers` on the
// corpus in tests/data/tokenizer (made by tools/goldens/tokenizer_goldens.py
// with the default model's vocabulary); it is skipped when the model is not
// downloaded. The other suites use small hand-made vocabularies.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "gguf/gguf.h"
#include "text/unicode.h"
#include "text/unicode_split.h"

namespace ferry::text {
namespace {

using Ids = std::vector<int32_t>;

// ------------------------------------------------------------ helpers

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(in);
}

std::filesystem::path data_dir() {
  return std::filesystem::path(FERRY_TEST_DATA) / "tokenizer";
}

std::filesystem::path model_path(const std::string& name) {
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "") / ".cache/ferry/models" / name;
}

// GPT-2's byte alphabet, written out independently of the implementation.
std::string byte_token(uint8_t b) {
  std::vector<int> direct;
  for (int c = '!'; c <= '~'; ++c) direct.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) direct.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) direct.push_back(c);
  char32_t cp = 0;
  if (std::find(direct.begin(), direct.end(), b) != direct.end()) {
    cp = b;
  } else {
    cp = 0x100;
    for (int c = 0; c < b; ++c) {
      if (std::find(direct.begin(), direct.end(), c) == direct.end()) ++cp;
    }
  }
  std::string s;
  utf8_append(s, cp);
  return s;
}

// A vocabulary whose first 256 tokens are the bytes (id = byte value),
// followed by `extra` normal tokens and then `added` tokens of given types.
struct TinyVocab {
  TokenizerSpec spec;
  int32_t add(const std::string& text, TokenType type = TokenType::kNormal) {
    spec.tokens.push_back(text);
    spec.token_types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(spec.tokens.size() - 1);
  }
  TinyVocab() {
    for (int b = 0; b < 256; ++b) add(byte_token(static_cast<uint8_t>(b)));
  }
};

Ids bytes_of(std::string_view s) {
  Ids ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ------------------------------------------------------------ goldens

struct Golden {
  nlohmann::json goldens;
  nlohmann::json corpus;  // name -> {"text", optional "roundtrip": false}
  std::unique_ptr<gguf::File> file;
};

const Golden* golden() {
  static const std::unique_ptr<Golden> g = [] {
    auto g = std::make_unique<Golden>();
    g->goldens = read_json(data_dir() / "goldens.json");
    for (const auto& c : read_json(data_dir() / "corpus.json")) {
      g->corpus[c.at("name").get<std::string>()] = c;
    }
    const auto path = model_path(g->goldens.at("model").get<std::string>());
    if (std::filesystem::exists(path)) g->file = gguf::File::open(path.string());
    return g;
  }();
  return g.get();
}

class TokenizerGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!golden()->file) GTEST_SKIP() << "model not downloaded (tools/fetch-model.sh)";
    TokenizerSpec spec = Tokenizer::spec_from_gguf(*golden()->file);
    spec.pre = GetParam();
    tok_ = Tokenizer::from_spec(std::move(spec));
  }
  const nlohmann::json& cases() const { return golden()->goldens.at("families").at(GetParam()); }
  std::string text(const nlohmann::json& c) const {
    return golden()->corpus.at(c.at("name").get<std::string>()).at("text").get<std::string>();
  }
  // False where the text has bytes without a token (BPE drops them).
  bool round_trips(const nlohmann::json& c) const {
    return golden()->corpus.at(c.at("name").get<std::string>()).value("roundtrip", true);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(TokenizerGolden, IdsMatchHuggingFace) {
  ASSERT_GE(cases().size(), 60u);
  for (const auto& c : cases()) {
    const std::string s = text(c);
    SCOPED_TRACE(c["name"].get<std::string>());
    const Ids ids = tok_->encode(s);
    EXPECT_EQ(ids, c["ids"].get<Ids>());
    EXPECT_EQ(tok_->decode(ids) == s, round_trips(c));
  }
}

TEST_P(TokenizerGolden, PlainTextIdsMatchHuggingFace) {
  for (const auto& c : cases()) {
    const std::string s = text(c);
    SCOPED_TRACE(c["name"].get<std::string>());
    const Ids want = c.contains("ids_plain") ? c["ids_plain"].get<Ids>() : c["ids"].get<Ids>();
    const Ids ids = tok_->encode(s, /*parse_special=*/false);
    EXPECT_EQ(ids, want);
    EXPECT_EQ(tok_->decode(ids) == s, round_trips(c));
  }
}

TEST_P(TokenizerGolden, PiecesMatchHuggingFace) {
  for (const auto& c : cases()) {
    const std::string s = text(c);
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<ByteSpan> spans;
    pretokenize(tok_->pre_tokenizer(), s, spans);
    std::vector<std::array<size_t, 2>> got;
    for (const ByteSpan& p : spans) got.push_back({p.begin, p.end});
    EXPECT_EQ(got, (c["pieces"].get<std::vector<std::array<size_t, 2>>>()));
  }
}

TEST_P(TokenizerGolden, StreamingEqualsDecodeAndNeverSplitsCharacters) {
  for (const auto& c : cases()) {
    const std::string s = text(c);
    SCOPED_TRACE(c["name"].get<std::string>());
    StreamDecoder stream(*tok_);
    std::string joined;
    for (int32_t id : tok_->encode(s)) {
      const std::string piece = stream.push(id);
      EXPECT_TRUE(utf8_valid(piece));
      joined += piece;
    }
    joined += stream.flush();
    EXPECT_EQ(joined, tok_->decode(tok_->encode(s)));
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerGolden,
                         ::testing::Values("smollm", "gpt2", "llama-bpe", "qwen2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(TokenizerModel, ReadsSmolLM2Metadata) {
  if (!golden()->file) GTEST_SKIP() << "model not downloaded (tools/fetch-model.sh)";
  const auto tok = Tokenizer::from_gguf(*golden()->file);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->pre_tokenizer(), PreTokenizer::kSmolLM);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->eot(), 2);  // no eot key: found by name (<|im_end|>)
  EXPECT_EQ(tok->find("<|im_start|>"), 1);
  EXPECT_EQ(tok->find("<|im_end|>"), 2);
  EXPECT_EQ(tok->find("Ġthe"), 260);
  EXPECT_EQ(tok->find("no such token"), std::nullopt);
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_TRUE(tok->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tok->is_end_of_generation(1));
  EXPECT_FALSE(tok->is_end_of_generation(260));
  EXPECT_EQ(tok->token_bytes(260), " the");
  EXPECT_EQ(tok->token_text(260), "Ġthe");
  EXPECT_EQ(tok->token_type(1), TokenType::kControl);
  const Ids chat = tok->encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(tok->decode(chat, /*skip_special=*/true), "user\nhi");
}

// Encoding 100 KB must stay far below a second in an optimised build; the
// worst cases for BPE are single long pieces.
TEST(TokenizerModel, EncodesHundredKilobytesQuickly) {
  if (!golden()->file) GTEST_SKIP() << "model not downloaded (tools/fetch-model.sh)";
  const auto tok = Tokenizer::from_gguf(*golden()->file);
  std::string mixed;
  while (mixed.size() < 100'000) {
    for (const auto& [name, c] : golden()->corpus.items()) {
      if (c.value("roundtrip", true)) mixed += c["text"].get<std::string>() + "\n";
    }
  }
  std::string cjk;
  while (cjk.size() < 100'000) cjk += "\u6211\u7231\u81ea\u7136\u8bed\u8a00\u5904\u7406";
  const std::pair<const char*, std::string> texts[] = {
      {"corpus", mixed},
      {"one letter run", std::string(100'000, 'a')},
      {"one space run", std::string(100'000, ' ')},
      {"one punctuation run", std::string(100'000, '=')},
      {"CJK without spaces", cjk},
  };
  for (const auto& [what, t] : texts) {
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tok->encode(t);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  %-20s %zu bytes -> %zu tokens in %.1f ms\n", what, t.size(), ids.size(),
                s * 1e3);
    EXPECT_EQ(tok->decode(ids), t);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
    EXPECT_LT(s, 0.5) << what;
#endif
  }
}

// Any bytes, ill-formed UTF-8 included, encode to tokens whose bytes give the
// input back, less the bytes the vocabulary has no token for.
TEST(TokenizerModel, RandomBytesRoundTripInEveryFamily) {
  if (!golden()->file) GTEST_SKIP() << "model not downloaded (tools/fetch-model.sh)";
  const std::string_view alphabet[] = {
      " ",      "  ",     "\n",     "\r\n",     "\t",         "a",      "Z",      "'s",
      "'LL",    "7",      "42",     ".",        "<|im_end|>", "\u00e9", "\u6211", "\U0001F600",
      "\u200d", "\u00a0", "\u0663", "\xf0\x9f", "\x80",       "\xff"};
  std::mt19937 rng(1234);
  for (const char* pre : {"gpt2", "smollm", "llama-bpe", "qwen2"}) {
    TokenizerSpec spec = Tokenizer::spec_from_gguf(*golden()->file);
    spec.pre = pre;
    const auto tok = Tokenizer::from_spec(std::move(spec));
    for (int iter = 0; iter < 500; ++iter) {
      std::string text;
      const int n = static_cast<int>(rng() % 40);
      for (int k = 0; k < n; ++k) {
        if (rng() % 4 == 0) {
          text += static_cast<char>(rng() % 256);
        } else {
          text += alphabet[rng() % std::size(alphabet)];
        }
      }
      std::string want, got;
      for (char c : text) {
        if (tok->find(byte_token(static_cast<uint8_t>(c)))) want += c;
      }
      for (int32_t id : tok->encode(text)) got += tok->token_bytes(id);
      ASSERT_EQ(got, want) << pre << " iteration " << iter;
    }
  }
}

// ------------------------------------------------------------ pre-tokenizers

std::vector<std::string> pieces(PreTokenizer kind, std::string_view text) {
  std::vector<ByteSpan> spans;
  pretokenize(kind, text, spans);
  std::vector<std::string> out;
  for (const ByteSpan& p : spans) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerSplit, Gpt2SpaceRunsLeaveOneSpaceForTheNextWord) {
  // \s+(?!\S) gives back the last space when a non-space follows.
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "a \n b"), (Pieces{"a", " \n", " b"}));
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "\nx"), (Pieces{"\n", "x"}));  // only ' ' leads a word
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "a  1 !!"), (Pieces{"a", " ", " 1", " !!"}));
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, "it's 'RE"), (Pieces{"it", "'s", " '", "RE"}));
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, ""), Pieces{});
}

TEST(TokenizerSplit, SmolLMSplitsDigitsFirst) {
  // The space run before "1" ends its segment, so it stays whole.
  EXPECT_EQ(pieces(PreTokenizer::kSmolLM, "a  123b"), (Pieces{"a", "  ", "1", "2", "3", "b"}));
  EXPECT_EQ(pieces(PreTokenizer::kSmolLM, "\u00bd\u0663"), (Pieces{"\u00bd", "\u0663"}));
}

TEST(TokenizerSplit, Llama3GroupsDigitsAndNewlines) {
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "1234567 x"), (Pieces{"123", "456", "7", " x"}));
  EXPECT_EQ(pieces(PreTokenizer::kQwen2, "123"), (Pieces{"1", "2", "3"}));
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "a \n\n b"), (Pieces{"a", " \n\n", " b"}));
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "x ...\n\ny"), (Pieces{"x", " ...\n\n", "y"}));
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "I'M \u017f'S"), (Pieces{"I", "'M", " \u017f", "'S"}));
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "'\u017fa"), (Pieces{"'\u017f", "a"}));
  EXPECT_EQ(pieces(PreTokenizer::kLlama3, "\tword\nnext"), (Pieces{"\tword", "\n", "next"}));
}

TEST(TokenizerSplit, IllFormedUtf8IsKeptAndCovered) {
  const std::string bad = "ab\xff\xfe cd\xe2\x82";
  EXPECT_EQ(pieces(PreTokenizer::kGpt2, bad), (Pieces{"ab", "\xff\xfe", " cd", "\xe2\x82"}));
}

// ------------------------------------------------------------ BPE

TEST(TokenizerBpe, MergesByRankNotByPosition) {
  TinyVocab v;
  const int32_t bc = v.add("bc"), ab = v.add("ab"), abc = v.add("abc");
  v.spec.merges = {"b c", "a b", "a bc"};
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_EQ(tok->encode("abc"), (Ids{abc}));
  EXPECT_EQ(tok->encode("ab"), (Ids{ab}));
  EXPECT_EQ(tok->encode("bca"), (Ids{bc, 'a'}));
  v.spec.merges = {"a b", "b c", "a bc"};  // now "ab" + "c" has no merge
  EXPECT_EQ(Tokenizer::from_spec(v.spec)->encode("abc"), (Ids{ab, 'c'}));
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  TinyVocab v;
  const int32_t aa = v.add("aa"), aaaa = v.add("aaaa");
  v.spec.merges = {"a a", "aa aa"};
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_EQ(tok->encode("aaa"), (Ids{aa, 'a'}));
  EXPECT_EQ(tok->encode("aaaa"), (Ids{aaaa}));
  EXPECT_EQ(tok->encode("aaaaa"), (Ids{aaaa, 'a'}));
}

TEST(TokenizerBpe, SpacesAreGWithDotAndMergesStayInsidePieces) {
  TinyVocab v;
  const int32_t sp_a = v.add("Ġa"), a_sp = v.add("aĠ");
  v.spec.merges = {"a Ġ", "Ġ a"};
  const auto tok = Tokenizer::from_spec(v.spec);
  // "a a" splits as "a" | " a": the higher-priority "a " merge would cross.
  EXPECT_EQ(tok->encode("a a"), (Ids{'a', sp_a}));
  EXPECT_EQ(tok->token_bytes(sp_a), " a");
  EXPECT_EQ(tok->token_bytes(a_sp), "a ");
  EXPECT_EQ(tok->token_bytes('\n'), "\n");
  EXPECT_EQ(tok->token_text('\n'), "Ċ");
}

TEST(TokenizerBpe, AddedTokensLongestMatchAndParseSpecial) {
  TinyVocab v;
  const int32_t x = v.add("<|x|>", TokenType::kControl);
  const int32_t xy = v.add("<|x|>y", TokenType::kControl);
  const int32_t user = v.add("<u>", TokenType::kUserDefined);
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_EQ(tok->encode("a<|x|>yb<|x|>"), (Ids{'a', xy, 'b', x}));
  EXPECT_EQ(tok->encode("<u><|x|"), (Ids{user, '<', '|', 'x', '|'}));
  // parse_special=false: control tokens are text, user-defined ones still match.
  Ids want = bytes_of("<|x|>");
  want.push_back(user);
  EXPECT_EQ(tok->encode("<|x|><u>", /*parse_special=*/false), want);
  EXPECT_EQ(tok->decode(Ids{'a', x, user, 'b'}), "a<|x|><u>b");
  EXPECT_EQ(tok->decode(Ids{'a', x, user, 'b'}, /*skip_special=*/true), "a<u>b");
}

TEST(TokenizerBpe, MergesNeverProduceAddedTokens) {
  TinyVocab v;
  const int32_t ab = v.add("ab", TokenType::kControl);
  v.spec.merges = {"a b"};
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_EQ(tok->encode("xab", /*parse_special=*/false), (Ids{'x', 'a', 'b'}));
  EXPECT_EQ(tok->encode("xab"), (Ids{'x', ab}));  // matched as an added token
}

TEST(TokenizerBpe, Llama3IgnoresMergesForWholeTokens) {
  TinyVocab v;
  const int32_t abc = v.add("abc");
  const auto tok = Tokenizer::from_spec(v.spec);  // no merges at all
  EXPECT_EQ(tok->encode("abc"), bytes_of("abc"));
  v.spec.pre = "llama-bpe";
  EXPECT_EQ(Tokenizer::from_spec(v.spec)->encode("abc"), (Ids{abc}));
}

TEST(TokenizerBpe, EndOfGenerationTokens) {
  TinyVocab v;
  const int32_t eos = v.add("<|end_of_text|>", TokenType::kControl);
  const int32_t eot = v.add("<|eot_id|>", TokenType::kControl);
  const int32_t other = v.add("<|start_header_id|>", TokenType::kControl);
  const int32_t eom = v.add("<|eom_id|>", TokenType::kControl);
  v.spec.eos = eos;
  v.spec.eot = eot;
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_TRUE(tok->is_end_of_generation(eos));
  EXPECT_TRUE(tok->is_end_of_generation(eot));
  EXPECT_TRUE(tok->is_end_of_generation(eom));
  EXPECT_FALSE(tok->is_end_of_generation(other));
  EXPECT_FALSE(tok->is_end_of_generation('a'));
  EXPECT_EQ(tok->eos(), eos);
  EXPECT_EQ(tok->eot(), eot);
}

TEST(TokenizerBpe, IllFormedInputRoundTripsAsBytes) {
  TinyVocab v;
  const auto tok = Tokenizer::from_spec(v.spec);
  const std::string bad = "a\xff\xc3";
  const Ids ids = tok->encode(bad);
  EXPECT_EQ(ids, bytes_of(bad));
  std::string raw;
  for (int32_t id : ids) raw += tok->token_bytes(id);
  EXPECT_EQ(raw, bad);
  EXPECT_EQ(tok->decode(ids), "a\uFFFD\uFFFD");  // decode always returns valid UTF-8
}

// ------------------------------------------------------------ streaming

TEST(TokenizerStream, HoldsBackACharacterSplitAcrossTokens) {
  TinyVocab v;
  const auto tok = Tokenizer::from_spec(v.spec);
  StreamDecoder s(*tok);
  const std::string emoji = "\U0001F600";  // F0 9F 98 80, one byte token each
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push(static_cast<uint8_t>(emoji[0])), "");
  EXPECT_EQ(s.push(static_cast<uint8_t>(emoji[1])), "");
  EXPECT_EQ(s.push(static_cast<uint8_t>(emoji[2])), "");
  EXPECT_EQ(s.push(static_cast<uint8_t>(emoji[3])), emoji);
  EXPECT_EQ(s.flush(), "");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
  TinyVocab v;
  const auto tok = Tokenizer::from_spec(v.spec);
  StreamDecoder s(*tok);
  EXPECT_EQ(s.push(0xFF), "\uFFFD");  // can never start a character
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push('a'), "\uFFFDa");  // F0 9F cut short: one U+FFFD
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.flush(), "\uFFFD");  // unfinished at the end
  EXPECT_EQ(s.push('b'), "b");     // flush reset the decoder
  EXPECT_EQ(tok->decode(Ids{0xFF, 0xF0, 0x9F, 'a', 0xE2}), "\uFFFD\uFFFDa\uFFFD");
}

TEST(TokenizerStream, MatchesDecodeForEveryPrefixOfMultiByteText) {
  TinyVocab v;
  const auto tok = Tokenizer::from_spec(v.spec);
  const std::string text = "h\u00e9 \u6211 \U0001F468\u200d\U0001F469 \xf0\x9f x\xed\xa0\x80";
  const Ids ids = bytes_of(text);
  StreamDecoder s(*tok);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = s.push(ids[i]);
    EXPECT_TRUE(utf8_valid(piece)) << "after token " << i;
    joined += piece;
  }
  joined += s.flush();
  EXPECT_EQ(joined, tok->decode(ids));
}

TEST(TokenizerStream, SkipSpecialDropsControlTokens) {
  TinyVocab v;
  const int32_t end = v.add("<|im_end|>", TokenType::kControl);
  const auto tok = Tokenizer::from_spec(v.spec);
  StreamDecoder keep(*tok), skip(*tok, /*skip_special=*/true);
  EXPECT_EQ(keep.push(end), "<|im_end|>");
  EXPECT_EQ(skip.push(end), "");
}

// ------------------------------------------------------------ UTF-8

TEST(TokenizerUtf8, MaximalSubpartsBecomeOneReplacementEach) {
  auto lossy = [](std::string_view s) {
    std::string out;
    EXPECT_EQ(utf8_append_lossy(out, s, /*final=*/true), s.size());
    return out;
  };
  EXPECT_EQ(lossy("ok \u00e9\u6211\U0001F600"), "ok \u00e9\u6211\U0001F600");
  EXPECT_EQ(lossy("\xc0\xaf"), "\uFFFD\uFFFD");                      // overlong lead: bytes each
  EXPECT_EQ(lossy("\xe0\x80\x80"), "\uFFFD\uFFFD\uFFFD");            // E0 needs A0..BF next
  EXPECT_EQ(lossy("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");            // surrogate
  EXPECT_EQ(lossy("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // > U+10FFFF
  EXPECT_EQ(lossy("\xf0\x9f\x98x"), "\uFFFDx");                      // cut-short sequence: one
  EXPECT_EQ(lossy("\xe2\x82"), "\uFFFD");
  std::string out;
  EXPECT_EQ(utf8_append_lossy(out, "a\xe2\x82", /*final=*/false), 1u);
  EXPECT_EQ(out, "a");
}

TEST(TokenizerUtf8, ClassesFollowTheRegexDefinitions) {
  EXPECT_EQ(cp_class('a'), CpClass::kLetter);
  EXPECT_EQ(cp_class('7'), CpClass::kNumber);
  EXPECT_EQ(cp_class(' '), CpClass::kSpace);
  EXPECT_EQ(cp_class('\x1c'), CpClass::kOther);  // Python's isspace, not \s
  EXPECT_EQ(cp_class(0x85), CpClass::kSpace);
  EXPECT_EQ(cp_class(0x3000), CpClass::kSpace);
  EXPECT_EQ(cp_class(0x200B), CpClass::kOther);  // zero width space is Cf
  EXPECT_EQ(cp_class(0x6211), CpClass::kLetter);
  EXPECT_EQ(cp_class(0x0663), CpClass::kNumber);
  EXPECT_EQ(cp_class(0x216B), CpClass::kNumber);  // Roman numeral twelve (Nl)
  EXPECT_EQ(cp_class(0x0301), CpClass::kOther);   // combining acute (Mn)
  EXPECT_EQ(cp_class(0x1F600), CpClass::kOther);
  EXPECT_EQ(cp_class(0x105C0), CpClass::kLetter);  // Todhri, new in Unicode 16
  EXPECT_EQ(cp_class(0x10FFFF), CpClass::kOther);
}

// ------------------------------------------------------------ errors

TEST(TokenizerErrors, BadSpecsAreRejectedWithTheReason) {
  TinyVocab v;
  v.add("ab");
  auto with = [&](auto edit) {
    TokenizerSpec s = v.spec;
    edit(s);
    return error_of([&] { Tokenizer::from_spec(s); });
  };
  EXPECT_EQ(with([](TokenizerSpec& s) { s.pre = "bogus"; }),
            "[tokenizer] unsupported pre-tokenizer tokenizer.ggml.pre = 'bogus' "
            "(supported: default, gpt2, smollm, llama-bpe, qwen2)");
  EXPECT_EQ(with([](TokenizerSpec& s) { s.merges = {"a q"}; }),
            "[tokenizer] merge 0 'a q': 'aq' is not in the vocabulary");
  EXPECT_EQ(with([](TokenizerSpec& s) {
              s.merges = {"a b", "ab"};
            }),
            "[tokenizer] merge 1 'ab' is not two tokens separated by one space");
  EXPECT_EQ(with([](TokenizerSpec& s) { s.token_types.pop_back(); }),
            "[tokenizer] 256 token types for 257 tokens");
  EXPECT_EQ(with([](TokenizerSpec& s) { s.eos = 257; }),
            "[tokenizer] eos id 257 out of range [0, 257)");
  EXPECT_EQ(with([](TokenizerSpec& s) { s.token_types[3] = 9; }),
            "[tokenizer] token 3 has unknown type 9");
  EXPECT_EQ(with([](TokenizerSpec& s) { s.tokens.clear(), s.token_types.clear(); }),
            "[tokenizer] empty vocabulary");
}

TEST(TokenizerErrors, OutOfRangeIdsThrow) {
  TinyVocab v;
  const auto tok = Tokenizer::from_spec(v.spec);
  EXPECT_EQ(error_of([&] {
              tok->decode(Ids{1, 256});
            }),
            "[tokenizer] token id 256 out of range [0, 256)");
  EXPECT_THROW(tok->token_bytes(-1), ferry::Error);
  StreamDecoder s(*tok);
  EXPECT_THROW(s.push(1000), ferry::Error);
}

// A minimal GGUF image (version 3, no tensors): string metadata, two tokens
// and, with `merges`, an empty merge list.
std::vector<uint8_t> gguf_image(const std::vector<std::pair<std::string, std::string>>& kv,
                                bool merges) {
  std::vector<uint8_t> b;
  auto put = [&](const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  auto u64 = [&](uint64_t v) { put(&v, 8); };
  auto str = [&](const std::string& s) { u64(s.size()), put(s.data(), s.size()); };
  put("GGUF", 4);
  u32(3);
  u64(0);
  u64(kv.size() + (merges ? 2 : 1));
  for (const auto& [k, v] : kv) str(k), u32(8), str(v);
  str("tokenizer.ggml.tokens");
  u32(9), u32(8), u64(2), str("a"), str("b");
  if (merges) str("tokenizer.ggml.merges"), u32(9), u32(8), u64(0);
  return b;
}

TEST(TokenizerErrors, UnsupportedGgufModelOrPreNamesTheValue) {
  auto load = [](const std::vector<std::pair<std::string, std::string>>& kv, bool merges = true) {
    const std::vector<uint8_t> img = gguf_image(kv, merges);
    return error_of([&] { Tokenizer::from_gguf(*gguf::File::parse(img, "t.gguf")); });
  };
  EXPECT_EQ(load({{"tokenizer.ggml.model", "llama"}}),
            "[tokenizer] t.gguf: unsupported tokenizer.ggml.model 'llama' (only byte-level BPE, "
            "'gpt2', is supported)");
  EXPECT_NE(load({{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.pre", "deepseek-llm"}})
                .find("'deepseek-llm'"),
            std::string::npos);
  // Merges are required for a BPE vocabulary.
  EXPECT_NE(
      load({{"tokenizer.ggml.model", "gpt2"}}, /*merges=*/false).find("tokenizer.ggml.merges"),
      std::string::npos);
}

}  // namespace
}  // namespace ferry::text
