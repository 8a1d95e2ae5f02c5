// LayerWindow: runs layers [first, last) of a GGUF model, optionally with the token embeddings
// (input side) and the output norm + head (output side). The whole model is the window
// [0, n_layer) with both ends. Only the window's tensors are ever read from the file. The window
// runs on one compute backend (backend/backend.h), which holds its weights, its sequences' state
// and its activations; the host sees only the input rows, the boundary rows and the logits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"

namespace kvasir {

struct WindowSpec {
  int first = 0;          // first layer run
  int last = 0;           // one past the last layer run
  bool has_embed = true;  // holds token_embd: input is token ids
  bool has_head = true;   // holds output_norm + output: output is logits
};

struct WindowOptions {
  int n_ctx = 0;  // KV capacity per sequence; 0 = min(n_ctx_train, 4096)
  int n_threads = 1;
  int max_sequences = 64;  // refuse to open more KV caches than this
  // Recurrent-state checkpoints a sequence may keep (SeqChunk::n_checkpoints): each costs one
  // DeltaNet state per DeltaNet layer, allocated when a chunk first asks for them.
  int max_checkpoints = 8;
  std::string backend = "cpu";  // where it runs: cpu, opencl[:PLATFORM:DEVICE], cuda[:N]
  AttnType attn_type = AttnType::kF32;  // the cpu backend's attention operands (--attn-type)
};

// One contiguous run of positions of one sequence inside a batch.
struct SeqChunk {
  int seq_id = 0;
  int pos0 = 0;  // position of the chunk's first token; must equal the sequence's length so far
  int n_tokens = 0;
  bool want_logits = true;    // with a head: produce logits for this chunk's last row
  bool every_logits = false;  // with a head: logits for every row of this chunk (a verify chunk)
  // Rollback span: keep the recurrent (DeltaNet) state before each of the chunk's last
  // n_checkpoints rows, so that TruncateSequence can later keep any length from
  // pos0 + n_tokens - n_checkpoints on (a speculative verify batch of K + 1 rows asks for K + 1).
  // At most n_tokens and WindowOptions::max_checkpoints. A chunk that starts where the span ends
  // and checkpoints all its rows extends the span (the oldest dropped past max_checkpoints);
  // any other chunk replaces it. Attention layers need nothing: their cache just truncates.
  int n_checkpoints = 0;
};

struct ForwardInput {
  std::vector<SeqChunk> chunks;     // rows are the chunks' tokens, concatenated in order
  std::span<const int32_t> tokens;  // one id per row, when the window has the embeddings
  std::span<const float> hidden;    // [n_rows, n_embd] f32, when it has not
  bool all_logits = false;          // with a head: logits for every row, not just each chunk's last
  // With a head: also the hidden state of every row in ForwardOutput::hidden, in the form the
  // nextn block reads (after the output norm when cfg.nextn_normed_hidden, else before it).
  bool want_hidden = false;
};

struct ForwardOutput {
  std::vector<float> hidden;  // [n_rows, n_embd] f32, when the window has no head (or want_hidden)
  std::vector<float> logits;  // [n_out_rows, n_vocab] f32: the last row of each chunk that wants
                              // logits, in chunk order (every row of a chunk with every_logits,
                              // or of every chunk with all_logits)
};

// One run of the multi-token-prediction (nextn) block over rows of one sequence. Row i pairs the
// model's hidden state at position pos0 + i with the token that follows that position, and
// predicts the token after that one.
struct NextnInput {
  int seq_id = 0;
  int pos0 = 0;                     // must equal the sequence's nextn length so far
  std::span<const int32_t> tokens;  // [n] the token at position pos0 + i + 1
  std::span<const float> hidden;    // [n, n_embd] f32: ForwardOutput::hidden rows (want_hidden),
                                    // or NextnOutput::hidden rows when drafting on
  bool all_logits = false;          // logits for every row, not just the last
};

struct NextnOutput {
  std::vector<float> hidden;  // [n, n_embd] f32: the block's output, the hidden input of a chained
                              // draft (in the same form as ForwardOutput::hidden)
  std::vector<float> logits;  // [1 or n, n_vocab] f32: the token after NextnInput::tokens[i]
};

class LayerWindow {
 public:
  // Maps the window's tensors of `file` (which may be a full model or a stage slice holding at
  // least this window). Refuses a bad window ("layers 3:9 past n_layer 8"), unsupported
  // architecture or tensor type, or missing/misshapen tensors, naming the file and the tensor. The
  // backend is options.backend, opened with options.n_threads; one it cannot use (not built, no
  // such device) is refused, and so is a tensor type or an op it cannot run, naming the tensor or
  // layer, the type or op, and the backend. A device without room for the weights is refused naming
  // the sizes.
  static Result<std::unique_ptr<LayerWindow>> Load(std::shared_ptr<const GgufFile> file,
                                                   const WindowSpec& spec,
                                                   const WindowOptions& options);
  // The same on a backend opened by the caller (options.backend is then ignored).
  static Result<std::unique_ptr<LayerWindow>> Load(std::shared_ptr<const GgufFile> file,
                                                   const WindowSpec& spec,
                                                   const WindowOptions& options,
                                                   std::unique_ptr<Backend> backend);
  virtual ~LayerWindow() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const WindowSpec& spec() const = 0;
  virtual int n_ctx() const = 0;
  // The most checkpoints a chunk may ask for (WindowOptions::max_checkpoints).
  virtual int max_checkpoints() const = 0;
  // Bytes of tensor data this window reads (weights only).
  virtual uint64_t weight_bytes() const = 0;
  // The device the window runs on (its address is what --backend took).
  virtual const DeviceInfo& device() const = 0;
  // Bytes of the backend's own memory the weights take (0 when it reads the mapped file in place).
  virtual uint64_t device_weight_bytes() const = 0;
  // Bytes of KV cache one full-context sequence takes in this window.
  virtual uint64_t kv_bytes_per_sequence() const = 0;

  // Starts a sequence with an empty KV cache. Error if the id is in use or too many are open.
  virtual Status OpenSequence(int seq_id) = 0;
  // Frees the sequence's KV cache. Unknown ids are ignored.
  virtual void CloseSequence(int seq_id) = 0;
  // Bytes of state a sequence holds now (its KV caches as they have grown, recurrent states), or
  // 0 when it is not open.
  virtual uint64_t SequenceBytes(int seq_id) const = 0;
  // Tokens stored so far for a sequence, or -1 when it is not open.
  virtual int SequenceLength(int seq_id) const = 0;
  // Drops positions >= n_keep of a sequence (e.g. to retry from a known point, or to roll back
  // the rejected rows of a verify batch). A window with DeltaNet layers keeps only n_keep == 0
  // (the state cleared) or an n_keep inside the sequence's rollback span; others are refused
  // naming the span. The span shrinks to end at n_keep.
  virtual Status TruncateSequence(int seq_id, int n_keep) = 0;
  // Gives sequence `from`'s state (its positions, KV cache and recurrent states) the id `to`, as
  // if it had been opened as `to`; nothing is copied. Errors: `from` is not open, `to` is.
  virtual Status RenameSequence(int from, int to) = 0;
  // The shortest length TruncateSequence can keep other than 0 (the sequence's length when it has
  // no rollback span; 0 for a window without recurrent layers), or -1 when it is not open.
  virtual int RollbackFloor(int seq_id) const = 0;

  // Runs the window over a batch. Errors (not crashes) for: unknown sequence, pos0 not equal to the
  // sequence's length, context overflow ("sequence 3: 4100 tokens exceed context 4096"), token id
  // out of range, wrong input size.
  virtual Status Forward(const ForwardInput& in, ForwardOutput* out) = 0;

  // Multi-token prediction. A window with the head and the stack's last layer loads the model's
  // first nextn block when the file holds it (cfg.n_layer_nextn > 0); it keeps its own attention
  // cache per sequence, opened, closed and renamed with the sequence, and with its own length.
  virtual bool has_nextn() const = 0;
  // Positions in a sequence's nextn cache, or -1 when the sequence is not open (or no block).
  virtual int NextnLength(int seq_id) const = 0;
  // Drops nextn positions >= n_keep (rejected drafts). Errors name the sequence and the lengths.
  virtual Status TruncateNextn(int seq_id, int n_keep) = 0;
  // Runs the nextn block: appends the rows to the sequence's nextn cache and returns their output
  // hidden rows and the logits. Errors (not crashes): no block, unknown sequence, pos0 not the
  // nextn length, context overflow, token out of range, wrong hidden size.
  virtual Status ForwardNextn(const NextnInput& in, NextnOutput* out) = 0;
};

}  // namespace kvasir
