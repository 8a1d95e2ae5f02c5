// The --backend flag of the commands that run layers (generate, eval, bench, profile, stage, join)
// and --backends of `run`: the syntax, its checks before any side effect, and how a device is
// named in summaries and tables.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/registry.h"

namespace kvasir::cli {

// Adds --backend (default "cpu") to `app`.
CLI::Option* AddBackendFlag(CLI::App& app, std::string* spec);

// Checks a --backend value before the command does anything: nullopt when it can run here, else
// the exit code after printing why (2 for text that is not a backend, 1 for a backend this build
// lacks). `flag` names the flag in the message ("--backend", "--backends", "manifest rank 2").
std::optional<int> CheckBackendFlag(std::string_view cmd, std::string_view flag,
                                    const std::string& spec);

// Adds --attn-type f32|bf16 (default f32): the operands of the cpu backend's attention.
CLI::Option* AddAttnTypeFlag(CLI::App& app, AttnType* type);
// Checks --attn-type against the backends it will run on before the command does anything:
// nullopt when it can run here, else the exit code after printing why (bf16 on a backend other than
// cpu: 2; on a CPU without AVX512-BF16: 1).
std::optional<int> CheckAttnTypeFlag(std::string_view cmd, AttnType type,
                                     const std::vector<std::string>& backends);
// The device `spec` names on this machine, as "cpu (AMD EPYC 7B13 (AVX2))"; the spec alone when
// it cannot be listed.
std::string DeviceLabel(const std::string& spec);
// The device `spec` names on this machine, or an error naming the spec.
Result<DeviceInfo> FindDevice(const std::string& spec);

}  // namespace kvasir::cli
