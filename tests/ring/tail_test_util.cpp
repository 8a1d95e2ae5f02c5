#include "tail_test_util.h"

#include "gguf/gguf_file.h"
#include "model/arch/registry.h"
#include "ring/frame.h"

namespace kvasir::testing {

Result<ring::Message> RoundTrip(const ring::Message& m) {
  KV_RETURN_IF_ERROR(ring::CheckEncodable(m));
  const std::vector<uint8_t> bytes = ring::EncodeMessage(m);
  ring::FrameDecoder decoder;
  decoder.Feed(bytes);
  auto frame = decoder.Next();
  if (!frame.ok()) return frame.status();
  if (!frame->has_value()) return Error("no frame");
  return ring::DecodeMessage(**frame);
}

std::vector<float> ArgmaxRows(const std::vector<int32_t>& argmax, int n_vocab) {
  const auto v = static_cast<size_t>(n_vocab);
  std::vector<float> l(argmax.size() * v, 0.0f);
  for (size_t i = 0; i < argmax.size(); ++i) l[i * v + static_cast<size_t>(argmax[i])] = 5.0f;
  return l;
}

Result<std::unique_ptr<LayerWindow>> LoadWholeModel(const std::string& path,
                                                    const WindowOptions& options) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  if (!cfg.ok()) return cfg.status();
  return LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, options);
}

}  // namespace kvasir::testing
