// Mixture-of-experts FFN (qwen35moe): softmax router over all experts, top-k, weights renormalised
// to sum 1 (Backend::MoeRoute); each expert runs once per batch over the rows routed to it, so
// decode rows of many sessions share one pass over an expert's weights (Backend::MoeFfn); a shared
// SwiGLU expert scaled by sigmoid(shared_gate x) is added. A row's result depends only on the row.
#include "model/window_layers.h"

namespace kvasir {

void RunMoe(const ModelConfig& cfg, const MoeWeights& w, DevPtr in, int n_rows, DevPtr out,
            Backend& be, LayerScratch& s) {
  const int64_t rows = n_rows;
  // router [n_rows, n_expert] logits; route_ids, route_weights [n_rows, n_expert_used].
  be.MatMul(*w.router, in, n_rows, s.router);
  be.MoeRoute(s.router, n_rows, cfg.n_expert, cfg.n_expert_used, s.route_ids, s.route_weights);
  be.MoeFfn(*w.gate, *w.up, *w.down, in, n_rows, s.route_ids, s.route_weights, cfg.n_expert_used,
            out);
  if (!w.has_shared) return;
  RunDenseFfn(w.shared, cfg.n_ff_shexp, in, n_rows, s.ffn_sum, be, s);
  be.MatMul(*w.shared_gate, in, n_rows, s.shared_scale);
  be.Sigmoid(s.shared_scale, rows);
  be.ScaleRows(s.ffn_sum, s.shared_scale, n_rows, cfg.n_embd);
  be.Add(out, s.ffn_sum, rows * cfg.n_embd);
}

}  // namespace kvasir
