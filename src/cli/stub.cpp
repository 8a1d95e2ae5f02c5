// Placeholder bodies until each subcommand has its own file; remove as they land.
#include <cstdio>

#include "cli/commands.h"

namespace kvasir::cli {
namespace {
int NotYet(const char* name) {
  std::fprintf(stderr, "kvasir %s: not built yet\n", name);
  return 1;
}
}  // namespace
int InspectMain(int, char**) { return NotYet("inspect"); }
int GenerateMain(int, char**) { return NotYet("generate"); }
int EvalMain(int, char**) { return NotYet("eval"); }
int SynthMain(int, char**) { return NotYet("synth"); }
int BenchMain(int, char**) { return NotYet("bench"); }
}  // namespace kvasir::cli
