// Helpers of the last stage's unit tests (verify rows, spec tail, overlap, grammars): a message
// through the codec, rows of logits the test writes, and the whole model as one window.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"
#include "ring/messages.h"

namespace kvasir::testing {

// `m` encoded as a frame and decoded again; an error where the codec refuses it either way
// (CheckEncodable, a frame that does not decode).
Result<ring::Message> RoundTrip(const ring::Message& m);

// Rows of logits over a vocabulary of `n_vocab` whose argmax is `argmax[i]`:
// [argmax.size(), n_vocab] row-major, f32, 5 at the argmax and 0 elsewhere.
std::vector<float> ArgmaxRows(const std::vector<int32_t>& argmax, int n_vocab);

// Every layer of the model at `path` as one window (embeddings and output included).
Result<std::unique_ptr<LayerWindow>> LoadWholeModel(const std::string& path,
                                                    const WindowOptions& options = {});

}  // namespace kvasir::testing
