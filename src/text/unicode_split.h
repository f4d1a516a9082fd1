// Pre-tokenizers of the byte-level BPE families: split text into the pieces
// that BPE then encodes one by one (merges never cross a piece boundary).
//
// Each is the family's published regex, re-expressed as a scanner over code
// points that tries the alternatives in order at each position (leftmost-first,
// as Oniguruma does) and takes the first match. Linear in the text length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ferry::text {

enum class PreTokenizer : uint8_t {
  // GPT-2:
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // SmolLM (HF: Sequence[Digits(individual_digits), ByteLevel(use_regex)]):
  // every \p{N} code point is a piece of its own, and the GPT-2 regex splits
  // each run between them as if it were the whole text.
  kSmolLM,
  // Llama 3:
  //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2: as Llama 3 but \p{N} instead of \p{N}{1,3}.
  kQwen2,
};

struct ByteSpan {
  size_t begin, end;  // [begin, end) in bytes
};

// Appends the pieces of `text` to `out`, in order. The pieces are non-empty
// and tile the text exactly. Ill-formed UTF-8 is not rejected: each maximal
// ill-formed subpart counts as one code point of class kOther.
void pretokenize(PreTokenizer kind, std::string_view text, std::vector<ByteSpan>& out);

}  // namespace ferry::text
