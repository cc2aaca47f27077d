// Shared by the slice tests on the CPU and on CUDA: a last slice without the head (a pool's last
// worker) run in two steps, the first keeping no row and the second the last row.
#pragma once

#include <vector>

#include "runtime/slice.h"

namespace shoal::test {

/// What run_chained gives back: the front slice's hidden states and the back slice's, [n, d_model]
/// f32 each, every row computed; and the status of the first step that failed.
struct ChainedRows {
  std::vector<float> mid, all;
  Status st;
};

/// Runs prompt `ids` through `front` (the embedding and the first layers) and its hidden states
/// through `back` (the other layers, no head), both caches at position 0.
inline ChainedRows run_chained(Slice& front, Slice& back, const std::vector<int32_t>& ids, int d) {
  const int n = int(ids.size());
  ChainedRows r{std::vector<float>(size_t(n) * size_t(d)), std::vector<float>(size_t(n) * size_t(d)), {}};
  StepInput in;
  in.n = n;
  in.ids = ids.data();
  StepOutput to_mid;
  to_mid.hidden = r.mid.data();
  r.st = front.forward(in, to_mid);
  if (!r.st.ok()) return r;
  StepInput hop;
  hop.n = n;
  hop.hidden = r.mid.data();
  StepOutput every;
  every.hidden = r.all.data();
  r.st = back.forward(hop, every);
  return r;
}

/// What run_kept_rows gives back: the kept row [d_model] (f32), the first step's output buffer
/// (filled with -7 before the step, which keeps no row and must leave it so), and each step's status.
struct KeptRows {
  std::vector<float> kept, untouched;
  Status first, rest;
};

/// Runs f32 hidden states `x` [n, d] through slice s (a slice without the head that ends the
/// model, its cache at position 0): rows [0, split) with keep_rows 0, then rows [split, n) with
/// keep_rows 1.
inline KeptRows run_kept_rows(Slice& s, const std::vector<float>& x, int n, int d, int split) {
  KeptRows r{std::vector<float>(size_t(d), -7.0f), std::vector<float>(size_t(d), -7.0f), {}, {}};
  StepInput first, rest;
  first.n = split;
  first.hidden = x.data();
  rest.n = n - split;
  rest.pos0 = split;
  rest.hidden = x.data() + size_t(split) * size_t(d);
  StepOutput none, last;
  none.hidden = r.untouched.data();
  none.keep_rows = 0;
  last.hidden = r.kept.data();
  last.keep_rows = 1;
  r.first = s.forward(first, none);
  if (r.first.ok()) r.rest = s.forward(rest, last);
  return r;
}

}  // namespace shoal::test
