// ExchangeWindow: how many push/pull messages a worker keeps in flight,
// chosen from the step times it measures.
//
// The best depth depends on the path to the shards. Where the link is fast
// and a message's round trip is long (the shard waits for the step's other
// workers and applies the optimizer), a deep window keeps the link busy:
// ResNet-18 on one host went from 12.5k to 17.7k examples/s with 32 messages
// in flight instead of 8. Where the link is the bound, a deep window shares
// it between every message, so none finishes early: the first layers'
// parameters, which the next forward needs first, arrive with the last, and
// the shards apply nothing until the very end.
//
// So the window climbs: it starts at `start`, measures the median step time
// over a trial of steps, tries the next depth up, then down, and moves while
// a neighbour is faster by more than `margin`. Settled, it measures again
// every `settle_steps` steps (the link or the load may change). Medians keep
// the odd slow step (an evaluation, a checkpoint) out of the decision.
//
// Thread-compatible: one trainer records its steps.
#ifndef DOWNPOUR_WORKER_EXCHANGE_WINDOW_H_
#define DOWNPOUR_WORKER_EXCHANGE_WINDOW_H_

#include <string>
#include <vector>

namespace downpour {

class ExchangeWindow {
 public:
  struct Options {
    // The depths tried, ascending; the window is always one of them.
    std::vector<int> depths = {2, 4, 8, 16, 32, 64};
    int start = 8;
    // Steps measured per depth (after one step to let the change land).
    int trial_steps = 16;
    // A neighbour wins when its median step is below (1 - margin) of the
    // current depth's.
    double margin = 0.03;
    // Steps at a settled depth before it is measured again.
    int settle_steps = 2000;
  };

  // A fixed window: `depth` messages in flight, never moved.
  static ExchangeWindow Fixed(int depth);
  explicit ExchangeWindow(Options options);

  // Records one step's wall seconds; returns the window for the next step.
  int Record(double step_seconds);
  int depth() const { return options_.depths[index_]; }
  // True once a search has ended at the current depth (until the next).
  bool settled() const { return phase_ == Phase::kSettled; }
  // What the last search measured, for a log line: "8: 25.1 ms, 16: 21.0 ms".
  const std::string& last_search() const { return last_search_; }

 private:
  enum class Phase { kMeasure, kProbeUp, kProbeDown, kSettled, kFixed };

  // Starts a trial at depth index `index`.
  void Try(int index, Phase phase);
  // Tries the depth next to the current one in `direction` (+1 deeper, -1
  // shallower); false when there is none.
  bool Probe(int direction);
  // The trial at `trial_index_` ended with this median.
  void TrialEnded(double median);
  void Settle();

  Options options_;
  int index_ = 0;        // The depth in use when not trying another.
  int trial_index_ = 0;  // The depth being measured.
  Phase phase_ = Phase::kMeasure;
  bool moved_ = false;  // This search has moved already.
  double best_ = 0;     // Median step of depths_[index_] in this search.
  int skip_ = 0;        // Steps still to skip before the trial counts.
  std::vector<double> samples_;
  int settled_for_ = 0;
  std::string search_;
  std::string last_search_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_EXCHANGE_WINDOW_H_
