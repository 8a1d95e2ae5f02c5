// Subcommands of the `kvasir` binary. Each takes argv after the subcommand name's position (argv[0]
// is "kvasir <sub>") and returns the process exit code. All of them write logs and errors to
// stderr; only program output (generated text, tables, JSON) goes to stdout.
#pragma once

namespace kvasir::cli {

int InspectMain(int argc, char** argv);
int GenerateMain(int argc, char** argv);
int EvalMain(int argc, char** argv);
int SynthMain(int argc, char** argv);
int BenchMain(int argc, char** argv);
int StageMain(int argc, char** argv);
int RunMain(int argc, char** argv);
int ProfileMain(int argc, char** argv);
int PlanMain(int argc, char** argv);
int SliceMain(int argc, char** argv);
int FetchMain(int argc, char** argv);
int RelayMain(int argc, char** argv);
int IdMain(int argc, char** argv);
int MarketMain(int argc, char** argv);
int JoinMain(int argc, char** argv);
int TokenizeMain(int argc, char** argv);
int DevicesMain(int argc, char** argv);
int ServeMain(int argc, char** argv);
int AuditMain(int argc, char** argv);

}  // namespace kvasir::cli
