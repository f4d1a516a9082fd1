#include "kernels/kv_format.h"

#include "core/error.h"

namespace ferry::kernels {

void KvFormat::validate(size_t head_dim) const {
  if (kind != Kind::Affine) return;
  if (bits != 4 && bits != 8) fail("kv_format", "affine KV needs 4 or 8 bits, got ", int(bits));
  if (group != 32 && group != 64 && group != 128)
    fail("kv_format", "affine KV group must be 32, 64 or 128, got ", group);
  if (head_dim % group != 0)
    fail("kv_format", "head_dim ", head_dim, " is not a multiple of the KV group ", group);
}

std::string KvFormat::name() const {
  switch (kind) {
    case Kind::F32:
      return "f32";
    case Kind::F16:
      return "f16";
    case Kind::BF16:
      return "bf16";
    case Kind::Affine: {
      // Built with append: GCC 12 reports a false -Wrestrict on "q" + string.
      std::string s = "q";
      s.append(std::to_string(bits)).append("g").append(std::to_string(group));
      return s;
    }
  }
  return "?";
}

std::vector<size_t> KvFormat::plane_units(size_t head_dim) const {
  switch (kind) {
    case Kind::F32:
      return {4 * head_dim};
    case Kind::F16:
    case Kind::BF16:
      return {2 * head_dim};
    case Kind::Affine: {
      size_t groups = head_dim / group;
      return {head_dim * bits / 8, 2 * groups, 2 * groups};
    }
  }
  return {};
}

size_t KvFormat::bytes_per_head_token(size_t head_dim) const {
  size_t n = 0;
  for (size_t u : plane_units(head_dim)) n += u;
  return n;
}

KvFormat parse_kv_format(const std::string& t) {
  if (t == "f32") return KvFormat::f32();
  if (t == "f16") return KvFormat::f16();
  if (t == "bf16") return KvFormat::bf16();
  if (t.size() >= 2 && t[0] == 'q') {
    size_t g = t.find('g');
    std::string bits = t.substr(1, g == std::string::npos ? std::string::npos : g - 1);
    std::string group = g == std::string::npos ? "64" : t.substr(g + 1);
    if ((bits == "4" || bits == "8") && (group == "32" || group == "64" || group == "128"))
      return KvFormat::affine(std::stoi(bits), std::stoi(group));
  }
  fail("kv_format", "unknown KV format '", t,
       "' (use f32, f16, bf16, q8, q4, or qBgG with G in 32/64/128)");
}

}  // namespace ferry::kernels
