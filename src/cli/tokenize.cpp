// kvasir tokenize -m MODEL (-p TEXT | -f FILE) [--no-bos] [--parse-special] [--pieces]: the ids a
// model's tokenizer gives a text, on one line, or one `id<TAB>piece` line per token. Reads the
// GGUF header only; any tokenizer the engine supports (SPM, byte-level BPE) works, and a
// vocabulary-only GGUF is enough.
#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "tokenize";

// The piece with every byte a terminal would not show as itself escaped: \n \r \t \\ and \xNN
// for other control bytes and for bytes that are not part of valid UTF-8.
std::string EscapePiece(std::string_view piece) {
  std::string out;
  size_t i = 0;
  while (i < piece.size()) {
    const Utf8ScanResult r = ScanUtf8(piece.substr(i));
    const auto c = static_cast<uint8_t>(piece[i]);
    if (r.kind == Utf8Scan::kComplete && r.length > 1) {
      out.append(piece.substr(i, r.length));
      i += r.length;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
    ++i;
  }
  return out;
}

// The whole file as bytes; errors name the path.
Result<std::string> ReadTextFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Error("{}: is a directory, not a text file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("{}: cannot open the text file: {}", path, std::strerror(errno));
  std::string text;
  std::array<char, 1 << 16> buf;
  while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    text.append(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return Error("{}: cannot read the text file", path);
  return text;
}

}  // namespace

int TokenizeMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Print the token ids (or pieces) a model's tokenizer gives a text.",
                 "kvasir tokenize"};
    std::string model_path;
    std::string prompt;
    std::string text_file;
    bool no_bos = false;
    bool parse_special = false;
    bool pieces = false;
    app.add_option("-m,--model", model_path, "GGUF file with a tokenizer (a model or a vocabulary)")
        ->required();
    auto* p = app.add_option("-p,--prompt", prompt, "text to tokenize");
    auto* f = app.add_option("-f,--file", text_file, "read the text from this file (bytes as is)");
    app.add_flag("--no-bos", no_bos, "add no BOS/EOS even where the vocabulary asks for them");
    app.add_flag("--parse-special", parse_special,
                 "turn control-token text such as <|im_end|> into that token");
    app.add_flag("--pieces", pieces, "print one 'id<TAB>piece' line per token (piece escaped)");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (p->count() > 0 && f->count() > 0) return UsageError(kCmd, "use either -p or -f, not both");
    if (p->count() == 0 && f->count() == 0) {
      return UsageError(kCmd, "a text is required: -p TEXT or -f FILE");
    }

    std::string text = prompt;
    if (f->count() > 0) {
      auto read = ReadTextFile(text_file);
      if (!read.ok()) return Fail(kCmd, read.status());
      text = std::move(read).value();
    }

    auto file = OpenGguf(model_path);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto tok = Tokenizer::FromGguf((*file)->header(), model_path);
    if (!tok.ok()) return Fail(kCmd, tok.status());

    const std::vector<int32_t> ids = (*tok)->Encode(text, /*add_special=*/!no_bos, parse_special);
    std::string out;
    if (pieces) {
      for (int32_t id : ids) {
        out += fmt::format("{}\t{}\n", id, EscapePiece((*tok)->TokenToPiece(id, /*special=*/true)));
      }
    } else {
      for (size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? " " : "", ids[i]);
      out += "\n";
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return kExitOk;
  });
}

}  // namespace kvasir::cli
