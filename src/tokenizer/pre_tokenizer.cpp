#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "tokenizer/utf8.h"

namespace kvasir {
namespace {

// The expressions as the vocabularies' tokenizer.json files write them, except that the
// case-insensitive contractions are spelt out ('[sS]) so that no Unicode case folding ('ſ' is a
// case variant of 's') creeps in. \s and \S are rewritten by ExpandWhitespace before compiling.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kContractions =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))";
constexpr std::string_view kLlama3Rest =
    R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 takes digits one at a time.
constexpr std::string_view kQwen2Rest =
    R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5 keeps combining marks (\p{M}) inside words instead of splitting them off as symbols.
constexpr std::string_view kQwen35Rest =
    R"([^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One supported `tokenizer.ggml.pre` family: its names (canonical first) and expressions.
struct Variant {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;
  bool ignore_merges;
  bool add_bos;
};

const std::array<Variant, 5>& Variants() {
  static const std::string llama3 = std::string(kContractions) + "|" + std::string(kLlama3Rest);
  static const std::string qwen2 = std::string(kContractions) + "|" + std::string(kQwen2Rest);
  static const std::string qwen35 = std::string(kContractions) + "|" + std::string(kQwen35Rest);
  static const std::array<Variant, 5> variants = {{
      // llama.cpp's fallback for vocabularies it could not identify: punctuation runs first, then
      // GPT-2 words, then digit runs cut into groups of three.
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"},
       false,
       false},
      {{"gpt-2", "gpt2"}, {kGpt2}, false, false},
      {{"llama-bpe", "llama3", "llama-v3"}, {llama3}, true, true},
      {{"qwen2", "deepseek-r1-qwen"}, {qwen2}, false, false},
      {{"qwen35"}, {qwen35}, false, false},
  }};
  return variants;
}

// White_Space: \p{Z} plus TAB..CR and NEL. PCRE2's own \s under UCP leaves out NEL (U+0085).
constexpr std::string_view kWhiteSpaceClass = R"(\t-\r\x{85}\p{Z})";

// Replaces \s and \S (inside or outside a character class; \S only outside) by explicit classes.
std::string ExpandWhitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : fmt::format("[{}]", kWhiteSpaceClass);
      } else if (e == 'S') {
        KV_CHECK(!in_class, "\\S inside a character class in {}", pattern);
        out += fmt::format("[^{}]", kWhiteSpaceClass);
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

class PreTokenizer::Regex {
 public:
  explicit Regex(pcre2_code* code) : code_(code) {}
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  static Result<std::unique_ptr<Regex>> Compile(std::string_view source) {
    const std::string pattern = ExpandWhitespace(source);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return Error("expression '{}' does not compile at offset {}: {}", pattern, error_offset,
                   reinterpret_cast<const char*>(message.data()));
    }
    // JIT is only a speed-up: without it (no JIT on this platform) matching is the same.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::make_unique<Regex>(code);
  }

  // Splits the valid UTF-8 word [begin, end) of `text` into matches and the gaps between them,
  // appending [begin, end) pairs to *out. A matching error (a resource limit) leaves the rest of
  // the word as one piece.
  void SplitWord(std::string_view text, size_t begin, size_t end, pcre2_match_data* md,
                 std::vector<std::pair<size_t, size_t>>* out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
    const size_t length = end - begin;
    size_t pos = 0;   // next match attempt
    size_t done = 0;  // end of the last piece appended
    while (pos < length) {
      int rc = pcre2_match(code_, subject, length, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        // The JIT stack ran out: the interpreter keeps its backtracking on the heap.
        rc = pcre2_match(code_, subject, length, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         nullptr);
      }
      if (rc < 0) break;  // no match, or a resource limit even so: the rest is one piece
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t m_begin = ov[0];
      const size_t m_end = ov[1];
      if (m_end <= m_begin) {
        // None of the expressions matches empty text; step over one character if one ever does.
        pos = m_begin + Utf8LenFromLead(static_cast<uint8_t>(text[begin + m_begin]));
        continue;
      }
      if (m_begin > done) out->emplace_back(begin + done, begin + m_begin);
      out->emplace_back(begin + m_begin, begin + m_end);
      done = pos = m_end;
    }
    if (done < length) out->emplace_back(begin + done, end);
  }

  pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_;
};

PreTokenizer::~PreTokenizer() = default;

std::string PreTokenizer::SupportedNames() {
  std::string out;
  for (const Variant& v : Variants()) {
    if (!out.empty()) out += ", ";
    std::string aliases;
    for (auto it = v.names.begin() + 1; it != v.names.end(); ++it) {
      aliases += (aliases.empty() ? "" : ", ") + std::string(*it);
    }
    out += *v.names.begin();
    if (!aliases.empty()) out += " (" + aliases + ")";
  }
  return out;
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  for (const Variant& v : Variants()) {
    bool found = false;
    for (std::string_view n : v.names) found = found || n == name;
    if (!found) continue;
    std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
    pre->name_ = std::string(*v.names.begin());
    pre->ignore_merges_ = v.ignore_merges;
    pre->default_add_bos_ = v.add_bos;
    for (std::string_view source : v.regexes) {
      KV_ASSIGN_OR_RETURN(std::unique_ptr<Regex> regex, Regex::Compile(source));
      pre->regexes_.push_back(std::move(regex));
    }
    return pre;
  }
  return Error("'{}' is not supported (supported: {})", name, SupportedNames());
}

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> words;
  if (text.empty()) return words;

  // PCRE2 matches valid UTF-8 only: give it a copy where each ill-formed subpart is U+FFFD, and map
  // the cut points back. raw_at[i] is the offset in `text` of byte i of `clean` (at characters).
  std::string clean;
  std::vector<size_t> raw_at;
  std::string_view subject = text;
  for (size_t i = 0; i < text.size();) {
    const Utf8ScanResult r = ScanUtf8(text.substr(i));
    if (r.kind == Utf8Scan::kComplete) {
      i += r.length;
      continue;
    }
    // First bad byte: switch to the copy (built from here on only once).
    clean.assign(text.substr(0, i));
    raw_at.resize(i);
    for (size_t k = 0; k < i; ++k) raw_at[k] = k;
    while (i < text.size()) {
      const Utf8ScanResult s = ScanUtf8(text.substr(i));
      if (s.kind == Utf8Scan::kComplete) {
        for (size_t k = 0; k < s.length; ++k) raw_at.push_back(i + k);
        clean.append(text.substr(i, s.length));
        i += s.length;
      } else {
        for (size_t k = 0; k < kUtf8Replacement.size(); ++k) raw_at.push_back(i);
        clean.append(kUtf8Replacement);
        i += s.length;  // kIncomplete: all that is left
      }
    }
    raw_at.push_back(text.size());
    subject = clean;
    break;
  }

  std::vector<std::pair<size_t, size_t>> pieces = {{0, subject.size()}};
  std::vector<std::pair<size_t, size_t>> next;
  for (const std::unique_ptr<Regex>& regex : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex->code(), nullptr);
    KV_CHECK(md != nullptr, "out of memory for PCRE2 match data");
    next.clear();
    for (const auto& [begin, end] : pieces) regex->SplitWord(subject, begin, end, md, &next);
    pcre2_match_data_free(md);
    pieces.swap(next);
  }

  words.reserve(pieces.size());
  for (const auto& [begin, end] : pieces) {
    const size_t b = raw_at.empty() ? begin : raw_at[begin];
    const size_t e = raw_at.empty() ? end : raw_at[end];
    words.push_back(text.substr(b, e - b));
  }
  return words;
}

}  // namespace kvasir
