// Tokenizer factory and the metadata every vocabulary type shares.
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <variant>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"

namespace kvasir {
namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyAddBos = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kKeyAddEos = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kKeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix";

// Texts of end-of-turn tokens in common vocabularies; a token with one of these texts ends
// generation even when the file names no eot_token_id.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<|end_of_text|>", "<end_of_utterance>",
};

const char* TypeNameOf(const GgufValue& v) {
  return GgufTypeName(static_cast<GgufType>(v.value.index()));
}

// Numeric array elements as doubles; nullopt when the elements are not numbers.
std::optional<std::vector<double>> NumbersOf(const GgufArray& a) {
  return std::visit(
      [](const auto& items) -> std::optional<std::vector<double>> {
        using E = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
          return std::vector<double>(items.begin(), items.end());
        } else {
          return std::nullopt;
        }
      },
      a.items);
}

// Integer array elements widened to int64 (u64 values above INT64_MAX saturate); nullopt when the
// elements are not integers.
std::optional<std::vector<int64_t>> IntegersOf(const GgufArray& a) {
  return std::visit(
      [](const auto& items) -> std::optional<std::vector<int64_t>> {
        using E = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>) {
          std::vector<int64_t> out;
          out.reserve(items.size());
          for (E x : items) {
            if constexpr (std::is_same_v<E, uint64_t>) {
              out.push_back(x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                                ? std::numeric_limits<int64_t>::max()
                                : static_cast<int64_t>(x));
            } else {
              out.push_back(static_cast<int64_t>(x));
            }
          }
          return out;
        } else {
          return std::nullopt;
        }
      },
      a.items);
}

// The array under `key`, or nullptr when absent; an error when present but not an array.
Result<const GgufArray*> FindArray(const GgufHeader& header, const std::string& name,
                                   std::string_view key) {
  const GgufValue* v = header.Find(key);
  if (v == nullptr) return static_cast<const GgufArray*>(nullptr);
  const GgufArray* a = v->AsArray();
  if (a == nullptr)
    return Error("{}: {} has type {}, expected an array", name, key, TypeNameOf(*v));
  return a;
}

// Reads an optional bool key into *out (unchanged when absent).
Status ReadBool(const GgufHeader& header, const std::string& name, std::string_view key,
                bool* out) {
  const GgufValue* v = header.Find(key);
  if (v == nullptr) return Status::Ok();
  std::optional<bool> b = v->AsBool();
  if (!b) return Error("{}: {} has type {}, expected bool", name, key, TypeNameOf(*v));
  *out = *b;
  return Status::Ok();
}

// Reads an optional token id key into *id. Absent: a default already in *id is kept when it lies in
// the vocabulary, else becomes -1. Negative values and 0xFFFFFFFF (the "none" that converters
// write) give -1; any other id must be below n_vocab.
Status ReadTokenId(const GgufHeader& header, const std::string& name, std::string_view key,
                   int64_t n_vocab, int32_t* id) {
  const GgufValue* v = header.Find(key);
  if (v == nullptr) {
    if (*id >= n_vocab) *id = -1;
    return Status::Ok();
  }
  std::optional<int64_t> x = v->AsInt();
  if (!x) {
    if (v->AsUint()) {  // u64 above INT64_MAX
      return Error("{}: {} = {} is out of range (vocabulary has {} tokens)", name, key,
                   *v->AsUint(), n_vocab);
    }
    return Error("{}: {} has type {}, expected an integer", name, key, TypeNameOf(*v));
  }
  if (*x < 0 || *x == 0xFFFFFFFFll) {
    *id = -1;
    return Status::Ok();
  }
  if (*x >= n_vocab) {
    return Error("{}: {} = {} is out of range (vocabulary has {} tokens)", name, key, *x, n_vocab);
  }
  *id = static_cast<int32_t>(*x);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufHeader& header,
                                                       const std::string& name) {
  const GgufValue* v = header.Find(kKeyModel);
  if (v == nullptr) return Error("{}: {} is missing (no tokenizer in this file)", name, kKeyModel);
  const std::string* model = v->AsString();
  if (model == nullptr) {
    return Error("{}: {} has type {}, expected string", name, kKeyModel, TypeNameOf(*v));
  }
  if (*model == "llama") return SpmTokenizer::Create(header, name);
  if (*model == "gpt2") return BpeTokenizer::Create(header, name);
  return Error("{}: {} '{}' is not supported (supported: llama, gpt2)", name, kKeyModel, *model);
}

Status Tokenizer::LoadCommon(const GgufHeader& header, const std::string& name) {
  KV_ASSIGN_OR_RETURN(const GgufArray* tokens, FindArray(header, name, kKeyTokens));
  if (tokens == nullptr) return Error("{}: {} is missing", name, kKeyTokens);
  const auto* texts = std::get_if<std::vector<std::string>>(&tokens->items);
  if (texts == nullptr) {
    return Error("{}: {} is an array of {}, expected strings", name, kKeyTokens,
                 GgufTypeName(static_cast<GgufType>(tokens->items.index())));
  }
  if (texts->empty()) return Error("{}: {} is empty", name, kKeyTokens);
  if (texts->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Error("{}: {} has {} entries, more than token ids can address", name, kKeyTokens,
                 texts->size());
  }
  const size_t n = texts->size();
  tokens_ = *texts;

  scores_.assign(n, 0.0f);
  KV_ASSIGN_OR_RETURN(const GgufArray* scores, FindArray(header, name, kKeyScores));
  if (scores != nullptr) {
    std::optional<std::vector<double>> values = NumbersOf(*scores);
    if (!values) {
      return Error("{}: {} is an array of {}, expected numbers", name, kKeyScores,
                   GgufTypeName(static_cast<GgufType>(scores->items.index())));
    }
    if (values->size() != n) {
      return Error("{}: {} has {} entries but {} has {}", name, kKeyScores, values->size(),
                   kKeyTokens, n);
    }
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan((*values)[i])) return Error("{}: {}[{}] is NaN", name, kKeyScores, i);
      scores_[i] = static_cast<float>((*values)[i]);
    }
  }

  attrs_.assign(n, TokenAttr::kNormal);
  KV_ASSIGN_OR_RETURN(const GgufArray* types, FindArray(header, name, kKeyTokenType));
  if (types != nullptr) {
    std::optional<std::vector<int64_t>> values = IntegersOf(*types);
    if (!values) {
      return Error("{}: {} is an array of {}, expected integers", name, kKeyTokenType,
                   GgufTypeName(static_cast<GgufType>(types->items.index())));
    }
    if (values->size() != n) {
      return Error("{}: {} has {} entries but {} has {}", name, kKeyTokenType, values->size(),
                   kKeyTokens, n);
    }
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*values)[i];
      if (t < static_cast<int64_t>(TokenAttr::kUndefined) ||
          t > static_cast<int64_t>(TokenAttr::kByte)) {
        return Error("{}: {}[{}] = {} is not a known token type (0..6)", name, kKeyTokenType, i, t);
      }
      attrs_[i] = static_cast<TokenAttr>(t);
    }
  }

  const int64_t n_vocab = static_cast<int64_t>(n);
  KV_RETURN_IF_ERROR(ReadTokenId(header, name, "tokenizer.ggml.bos_token_id", n_vocab, &bos_));
  KV_RETURN_IF_ERROR(ReadTokenId(header, name, "tokenizer.ggml.eos_token_id", n_vocab, &eos_));
  KV_RETURN_IF_ERROR(ReadTokenId(header, name, "tokenizer.ggml.unknown_token_id", n_vocab, &unk_));
  KV_RETURN_IF_ERROR(ReadTokenId(header, name, "tokenizer.ggml.eot_token_id", n_vocab, &eot_));
  KV_RETURN_IF_ERROR(ReadTokenId(header, name, "tokenizer.ggml.eom_token_id", n_vocab, &eom_));
  KV_RETURN_IF_ERROR(ReadBool(header, name, kKeyAddBos, &add_bos_));
  KV_RETURN_IF_ERROR(ReadBool(header, name, kKeyAddEos, &add_eos_));
  KV_RETURN_IF_ERROR(ReadBool(header, name, kKeyAddSpacePrefix, &add_space_prefix_));

  eog_ids_.clear();
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id >= 0) eog_ids_.push_back(id);
  }
  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) {
    const TokenAttr a = attrs_[id];
    if (a != TokenAttr::kControl && a != TokenAttr::kUserDefined) continue;
    if (std::find(std::begin(kEotTexts), std::end(kEotTexts), tokens_[id]) == std::end(kEotTexts)) {
      continue;
    }
    if (eot_ < 0) eot_ = id;
    eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
  return Status::Ok();
}

std::string Tokenizer::TokenToPiece(int32_t id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  const TokenAttr attr = attrs_[id];
  if (!special && (attr == TokenAttr::kControl || attr == TokenAttr::kUnknown)) return {};
  return pieces_[id];
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool special,
                              bool skip_leading_space) const {
  std::string out;
  bool strip = skip_leading_space;
  for (int32_t id : ids) {
    const std::string piece = TokenToPiece(id, special);
    if (strip && !piece.empty()) {
      strip = false;
      if (piece[0] == ' ') {
        out.append(piece, 1, std::string::npos);
        continue;
      }
    }
    out += piece;
  }
  return out;
}

void Tokenizer::CollectSpecialTokens() {
  special_ids_.clear();
  for (int32_t id = 0; id < n_vocab(); ++id) {
    const TokenAttr a = attrs_[id];
    if (a != TokenAttr::kControl && a != TokenAttr::kUnknown && a != TokenAttr::kUserDefined)
      continue;
    if (!tokens_[id].empty()) special_ids_.push_back(id);
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(),
                   [this](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
}

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : special_ids_) {
    const TokenAttr attr = attrs_[id];
    // User-defined tokens are split out even without parse_special, as llama.cpp does.
    if (!parse_special && (attr == TokenAttr::kControl || attr == TokenAttr::kUnknown)) continue;
    const std::string& needle = tokens_[id];
    if (text.find(needle) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0;
      for (;;) {
        const size_t hit = raw.find(needle, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, f.offset + pos, hit - pos});
        next.push_back({id, f.offset + hit, needle.size()});
        pos = hit + needle.size();
      }
      if (pos < raw.size()) next.push_back({-1, f.offset + pos, raw.size() - pos});
    }
    frags.swap(next);
  }
  return frags;
}

bool Tokenizer::IsEog(int32_t id) const {
  return id >= 0 && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

}  // namespace kvasir
