// kvasir slice -m MODEL --layers A:B -o stage.gguf: writes a stage mini-GGUF holding one window of
// layers (see shard/slice.h). Tensor bytes are streamed from the model's mapping, so memory stays
// small whatever the model size.
#include "shard/slice.h"

#include <fmt/format.h>

#include <string>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "slice";

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int SliceMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Write a stage mini-GGUF holding one window of a model's layers, with all of its "
        "metadata (tokenizer included).",
        "kvasir slice"};
    std::string model_path, layers, out_path;
    app.add_option("-m,--model", model_path, "GGUF model file (full model or stage slice)")
        ->required();
    app.add_option("--layers", layers, "window of layers A:B (A included, B excluded)")->required();
    app.add_option("-o,--output", out_path, "stage GGUF file to write")->required();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    int first = 0, last = 0;
    if (Status s = ParseLayers(layers, &first, &last); !s.ok()) {
      return UsageError(kCmd, s.message());
    }
    if (Status s = CheckWritable(out_path); !s.ok()) return Fail(kCmd, s);
    auto parent = OpenGguf(model_path);
    if (!parent.ok()) return Fail(kCmd, parent.status());
    SliceSummary summary;
    if (Status s = WriteSlice(**parent, first, last, out_path, &summary); !s.ok()) {
      return Fail(kCmd, s);
    }
    KV_LOG_INFO("slice: wrote {}: layers {}:{}, {} tensors, {:.2f} MiB of the parent's {:.2f} MiB",
                out_path, first, last, summary.n_tensors, MiB(summary.bytes),
                MiB(summary.parent_bytes));
    return kExitOk;
  });
}

}  // namespace kvasir::cli
