// kvasir: one binary, one subcommand per file in src/cli. This file only dispatches.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "cli/commands.h"
#include "kernels/simd_target.h"

namespace {

struct Subcommand {
  const char* name;
  int (*main)(int, char**);
  const char* help;
};

constexpr Subcommand kSubcommands[] = {
    {"run", kvasir::cli::RunMain, "run a model as a local ring of stages and generate text"},
    {"stage", kvasir::cli::StageMain, "run one window of layers as a stage of a ring"},
    {"serve", kvasir::cli::ServeMain, "serve the OpenAI-compatible HTTP API in front of a ring"},
    {"generate", kvasir::cli::GenerateMain, "generate text from a prompt with a local model"},
    {"eval", kvasir::cli::EvalMain, "teacher-forced logits and perplexity of a token sequence"},
    {"profile", kvasir::cli::ProfileMain, "time this device on a model and print a devices.json entry"},
    {"devices", kvasir::cli::DevicesMain, "list this machine's devices by backend (cpu, opencl, cuda)"},
    {"plan", kvasir::cli::PlanMain, "choose devices and layer windows; write a rank manifest"},
    {"inspect", kvasir::cli::InspectMain, "show a GGUF file's metadata, tensors and layer sizes"},
    {"tokenize", kvasir::cli::TokenizeMain, "print the token ids a model's tokenizer gives a text"},
    {"bench", kvasir::cli::BenchMain, "measure prefill and decode tokens/s"},
    {"slice", kvasir::cli::SliceMain, "write a stage mini-GGUF holding one window of layers"},
    {"fetch", kvasir::cli::FetchMain, "download one window of a model over HTTP(S) range requests"},
    {"relay", kvasir::cli::RelayMain, "bridge ring edges over WebSocket for stages behind NAT"},
    {"market", kvasir::cli::MarketMain, "serve the coverage/demand map, claims and credit (docs/MARKET.md)"},
    {"join", kvasir::cli::JoinMain, "give this machine to the network: claim a window and serve it"},
    {"audit", kvasir::cli::AuditMain, "recompute audited windows for the market and fail those that differ"},
    {"id", kvasir::cli::IdMain, "print this node's public key (creating its key on first use)"},
    {"synth", kvasir::cli::SynthMain, "write a random-weight GGUF model of a given shape"},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: kvasir <command> [options]\n\ncommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(out, "  %-10s %s\n", s.name, s.help);
  std::fprintf(out, "\nRun 'kvasir <command> --help' for the options of a command.\n");
}

// KVASIR_SIMD_TARGET=AVX2 (any name a kernel target reports: AVX3_SPR, AVX3_DL, AVX3, AVX2, SSE4, ...)
// runs every kernel on that lower target, to measure what an AVX2-only host would get. Returns false
// after naming the targets this CPU has when the name is not one of them.
bool ApplySimdTargetFromEnv() {
  const char* want = std::getenv("KVASIR_SIMD_TARGET");
  if (want == nullptr || *want == '\0') return true;
  std::string have;
  for (int64_t t : kvasir::kernels_internal::AvailableSimdTargets()) {
    const std::string name = kvasir::kernels_internal::SimdTargetNameOf(t);
    if (name == want) {
      kvasir::kernels_internal::ForceSimdTarget(t);
      return true;
    }
    have += (have.empty() ? "" : ", ") + name;
  }
  std::fprintf(stderr, "kvasir: KVASIR_SIMD_TARGET=%s is not a kernel target of this CPU (it has: %s)\n",
               want, have.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!ApplySimdTargetFromEnv()) return 2;
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    PrintUsage(stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("kvasir 0.1.0\n");
    return 0;
  }
  for (const auto& s : kSubcommands) {
    if (cmd == s.name) return s.main(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "kvasir: unknown command '%s'\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
