#include "text/unicode_split.h"

#include <algorithm>

#include "text/unicode.h"

namespace ferry::text {

namespace {

struct Cp {
  char32_t cp;  // kBad for an ill-formed subpart
  CpClass cls;
  size_t off;  // byte offset in the text
};

constexpr char32_t kBad = 0xFFFFFFFF;
constexpr char32_t kEnd = 0xFFFFFFFE;  // what a scanner sees past its segment

std::vector<Cp> decode(std::string_view text) {
  std::vector<Cp> cps;
  cps.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    const Utf8Unit u = utf8_decode(text.substr(i));
    if (u.status == Utf8Unit::kValid) {
      cps.push_back({u.cp, cp_class(u.cp), i});
    } else {
      cps.push_back({kBad, CpClass::kOther, i});
    }
    i += u.len;
  }
  cps.push_back({kEnd, CpClass::kOther, text.size()});  // sentinel for offsets
  return cps;
}

// A segment of code points that a regex sees as the whole text: lookaheads
// and runs stop at its end.
class Segment {
 public:
  Segment(const Cp* cps, size_t n) : cps_(cps), n_(n) {}
  size_t size() const { return n_; }
  char32_t cp(size_t i) const { return i < n_ ? cps_[i].cp : kEnd; }
  bool is(size_t i, CpClass c) const { return i < n_ && cps_[i].cls == c; }
  size_t run(size_t i, CpClass c) const {
    while (is(i, c)) ++i;
    return i;
  }
  bool is_newline(size_t i) const { return cp(i) == U'\r' || cp(i) == U'\n'; }

 private:
  const Cp* cps_;
  size_t n_;
};

// 's|'t|'re|'ve|'m|'ll|'d at i, optionally case-insensitive as Oniguruma's
// (?i) is: besides ASCII case, U+017F LATIN SMALL LETTER LONG S folds to 's'
// (no other code point folds to one of these letters). Returns the end or 0.
size_t match_contraction(const Segment& s, size_t i, bool icase) {
  if (s.cp(i) != U'\'') return 0;
  auto at = [&](size_t k) -> char32_t {
    char32_t c = s.cp(k);
    if (!icase) return c;
    if (c >= U'A' && c <= U'Z') return c + (U'a' - U'A');
    return c == 0x17F ? U's' : c;
  };
  switch (at(i + 1)) {
    case U's':
    case U't':
    case U'm':
    case U'd':
      return i + 2;
    case U'r':
    case U'v':
      return at(i + 2) == U'e' ? i + 3 : 0;
    case U'l':
      return at(i + 2) == U'l' ? i + 3 : 0;
    default:
      return 0;
  }
}

// \s+(?!\S)|\s+ at i, where s[i] is whitespace: the greedy run gives back
// its last code point when a non-space follows, so that the space can lead
// the next piece; a lone space before a non-space is taken by \s+.
size_t match_trailing_space(const Segment& s, size_t i) {
  const size_t k = s.run(i, CpClass::kSpace);
  if (k == s.size() || k - i == 1) return k;
  return k - 1;
}

// One match of the GPT-2 regex at i (< s.size()); returns its end.
size_t match_gpt2(const Segment& s, size_t i) {
  if (size_t e = match_contraction(s, i, /*icase=*/false)) return e;
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the optional space only helps
  // when a non-space follows it; these three classes are exactly the
  // non-spaces, so the class of the first code point after it picks the rule.
  const bool lead = s.cp(i) == U' ' && i + 1 < s.size() && !s.is(i + 1, CpClass::kSpace);
  const size_t j = lead ? i + 1 : i;
  for (CpClass c : {CpClass::kLetter, CpClass::kNumber, CpClass::kOther}) {
    if (s.is(j, c)) return s.run(j, c);
  }
  return match_trailing_space(s, i);
}

// One match of the Llama 3 / Qwen2 regex at i (< s.size()); returns its end.
size_t match_llama3(const Segment& s, size_t i, size_t max_digits) {
  if (size_t e = match_contraction(s, i, /*icase=*/true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (s.is(i, CpClass::kLetter)) return s.run(i, CpClass::kLetter);
  if (!s.is(i, CpClass::kNumber) && !s.is_newline(i) && s.is(i + 1, CpClass::kLetter)) {
    return s.run(i + 1, CpClass::kLetter);
  }
  // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
  if (s.is(i, CpClass::kNumber)) return std::min(s.run(i, CpClass::kNumber), i + max_digits);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t j = (s.cp(i) == U' ' && s.is(i + 1, CpClass::kOther)) ? i + 1 : i;
  if (s.is(j, CpClass::kOther)) {
    size_t e = s.run(j, CpClass::kOther);
    while (s.is_newline(e)) ++e;
    return e;
  }
  // s[i] is whitespace now. \s*[\r\n]+ ends just after the run's last newline.
  const size_t k = s.run(i, CpClass::kSpace);
  for (size_t m = k; m > i; --m) {
    if (s.is_newline(m - 1)) return m;
  }
  return match_trailing_space(s, i);
}

template <typename Match>
void split_segment(const Cp* cps, size_t n, Match match, std::vector<ByteSpan>& out) {
  const Segment s(cps, n);
  for (size_t i = 0; i < n;) {
    const size_t e = match(s, i);
    out.push_back({cps[i].off, cps[e].off});
    i = e;
  }
}

}  // namespace

void pretokenize(PreTokenizer kind, std::string_view text, std::vector<ByteSpan>& out) {
  if (text.empty()) return;
  const std::vector<Cp> cps = decode(text);
  const size_t n = cps.size() - 1;
  switch (kind) {
    case PreTokenizer::kGpt2:
      split_segment(cps.data(), n, match_gpt2, out);
      break;
    case PreTokenizer::kSmolLM:
      for (size_t i = 0; i < n;) {
        if (cps[i].cls == CpClass::kNumber) {
          out.push_back({cps[i].off, cps[i + 1].off});
          ++i;
          continue;
        }
        size_t e = i;
        while (e < n && cps[e].cls != CpClass::kNumber) ++e;
        split_segment(cps.data() + i, e - i, match_gpt2, out);
        i = e;
      }
      break;
    case PreTokenizer::kLlama3:
    case PreTokenizer::kQwen2: {
      const size_t max_digits = kind == PreTokenizer::kLlama3 ? 3 : 1;
      split_segment(
          cps.data(), n, [&](const Segment& s, size_t i) { return match_llama3(s, i, max_digits); },
          out);
      break;
    }
  }
}

}  // namespace ferry::text
