#include "cli/model_loading.h"

#include <unistd.h>

#include <cstdio>

namespace ferry::cli {

LoadedModel load_model_files(const std::string& path, bool quiet) {
  const bool tty = isatty(STDERR_FILENO);
  if (!quiet) std::fprintf(stderr, "loading %s\n", path.c_str());
  int last_pct = -1;
  LoadedModel l;
  l.model = model::load_model(path, [&](double frac) {
    int pct = static_cast<int>(frac * 100);
    if (quiet || !tty || pct == last_pct) return;
    last_pct = pct;
    std::fprintf(stderr, "\rloading: %3d%%", pct);
  });
  if (!quiet && tty) std::fprintf(stderr, "\r\033[K");
  l.tok = text::Tokenizer::from_gguf(l.model->file());
  const std::string tmpl = l.model->file().get_string("tokenizer.chat_template", std::string());
  if (!tmpl.empty()) l.chat.emplace(tmpl);
  return l;
}

void KvOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--kv-bits", bits, "Quantize the KV cache to 4 or 8 bits (0: --kv-dtype)")
      ->capture_default_str()
      ->check(CLI::IsMember({0, 4, 8}));
  cmd->add_option("--kv-group", group, "Values per scale/bias along head_dim")
      ->capture_default_str()
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_option("--kv-dtype", dtype, "Dense KV storage when --kv-bits is 0")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
}

kernels::KvFormat KvOptions::format() const {
  return bits ? kernels::KvFormat::affine(bits, group) : kernels::parse_kv_format(dtype);
}

}  // namespace ferry::cli
