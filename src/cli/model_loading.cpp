#include "cli/model_loading.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#ifdef FERRY_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace ferry::cli {

void DeviceOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--device", device, "Where the model runs: cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_flag("--deterministic,!--no-deterministic", deterministic,
                "GPU: batch-invariant kernels (a row's logits never depend on the batch); "
                "--no-deterministic lets cuBLAS run batched products")
      ->capture_default_str();
  cmd->add_flag("--cuda-graphs,!--no-cuda-graphs", cuda_graphs,
                "GPU: replay repeated step shapes (decode steps) as CUDA graphs")
      ->capture_default_str();
  cmd->add_flag("--fp8", fp8,
                "GPU (compute capability 8.9+, with --no-deterministic): store the layers' "
                "dense weights as FP8 E4M3 with a scale per output column and run their "
                "products on FP8 tensor cores (activations quantized per row)")
      ->capture_default_str();
  cmd->add_option("--matmul", matmul,
                  "Products of quantized weights: int8 (fast; activations quantized to 8 "
                  "bits per block of 32; on the GPU for Q4_K and Q6_K weights) or exact "
                  "(float32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"int8", "exact"}));
}

void add_scheduler_options(CLI::App* cmd, engine::SchedulerOptions& so) {
  cmd->add_option("--max-batch", so.max_batch, "Requests decoded together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", so.prefill_chunk, "Prompt tokens per request per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--step-tokens,--step-token-budget", so.step_token_budget,
                  "Tokens forwarded per step (decode rows count 1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--step-target-ms", so.step_target_ms,
                  "While rows decode, cap a step's prompt tokens to keep it near this time "
                  "(0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--step-min-prefill", so.step_min_prefill,
                  "Prompt tokens a step may always take beside decode rows, whatever "
                  "--step-target-ms says (at least 1: prompts always progress)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

kernels::MatmulMode DeviceOptions::matmul_mode() const {
  return *kernels::parse_matmul_mode(matmul);
}

void DeviceOptions::apply(model::Model& m, bool quiet) const {
  if (fp8 && device == "cpu")
    fail("device", "--fp8 needs --device cuda: FP8 weights run on the GPU only");
  if (fp8 && deterministic)
    fail("device",
         "--fp8 needs --no-deterministic: its FP8 products (cuBLASLt) are not batch-invariant");
  if (device == "cpu") return;
  if (device.rfind("cuda", 0) != 0)
    fail("device", "unknown device '", device, "' (expected cpu, cuda or cuda:N)");
  int index = 0;
  if (device.size() > 4) {
    if (device[4] != ':' || device.size() == 5 || device.size() > 8 ||
        device.find_first_not_of("0123456789", 5) != std::string::npos)
      fail("device", "bad device '", device, "' (expected cuda or cuda:N)");
    index = std::stoi(device.substr(5));
  }
#ifdef FERRY_HAVE_CUDA
  cuda::CudaOptions o;
  o.deterministic = deterministic;
  o.graphs = cuda_graphs;
  o.matmul = matmul_mode();
  o.fp8 = fp8;
  o.device = index;
  m.set_backend(cuda::make_backend(o));
  if (!quiet)
    std::fprintf(stderr, "running on %s%s%s\n", m.device().c_str(),
                 deterministic ? " (deterministic)" : "", fp8 ? " (fp8 weights)" : "");
#else
  (void)m;
  (void)quiet;
  (void)index;
  fail("device", "this ferry was built without CUDA (configure with -DFERRY_CUDA=ON)");
#endif
}

LoadedModel load_model_files(const std::string& path, bool quiet, const DeviceOptions& device) {
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
  device.apply(*l.model, quiet);
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
