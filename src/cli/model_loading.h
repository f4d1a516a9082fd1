// Loading a model for a subcommand: the weights (with a progress line on a
// terminal), its tokenizer and its chat template. Shared by `ferry run` and
// `ferry serve`.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "engine/scheduler.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace ferry::cli {

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<text::Tokenizer> tok;
  std::optional<text::ChatTemplate> chat;  // the model's template, if any
};

// Where and how the model runs: --device cpu|cuda[:N], --deterministic
// (GPU: batch-invariant kernels, the default; --no-deterministic lets
// cuBLAS take batched products), --fp8 (GPU, fast mode) and --matmul. Shared by `run`,
// `serve` and `bench`.
struct DeviceOptions {
  std::string device = "cpu";
  bool deterministic = true;
  bool cuda_graphs = true;  // GPU: replay repeated step shapes as CUDA graphs
  // GPU, fast mode: the layers' dense weights as FP8 (cuda::CudaOptions::fp8).
  bool fp8 = false;
  // CPU products of quantized weights: int8 (activations quantized per
  // 32-block, integer dot products) or exact (f32); docs/KERNELS.md.
  std::string matmul = "int8";
  void add_to(CLI::App* cmd);
  kernels::MatmulMode matmul_mode() const;
  // Moves the model to the device (a no-op for the CPU). Throws
  // ferry::Error naming the problem: an unknown device, a build without
  // CUDA, no GPU.
  void apply(model::Model& m, bool quiet) const;
};

// Throws ferry::Error. Unless quiet, says what it loads on stderr.
LoadedModel load_model_files(const std::string& path, bool quiet, const DeviceOptions& device = {});

// The KV storage flags shared by `run` and `serve`: --kv-bits, --kv-group,
// --kv-dtype.
struct KvOptions {
  int bits = 0;  // 0: dense, stored as `dtype`
  int group = 64;
  std::string dtype;
  explicit KvOptions(std::string default_dtype) : dtype(std::move(default_dtype)) {}
  void add_to(CLI::App* cmd);
  kernels::KvFormat format() const;
};

// The scheduler's flags shared by `serve` and `bench`: --max-batch,
// --prefill-chunk, --step-tokens, --step-target-ms, written into `so`.
void add_scheduler_options(CLI::App* cmd, engine::SchedulerOptions& so);

}  // namespace ferry::cli
