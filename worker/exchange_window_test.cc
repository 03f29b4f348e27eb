#include "worker/exchange_window.h"

#include <functional>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace downpour {
namespace {

// Runs `steps` steps whose time is `step_ms(depth)`, with 2% noise and
// every 25th step five times slower (an evaluation); returns the window.
int RunSteps(ExchangeWindow& window, int steps, const std::function<double(int)>& step_ms,
             int seed = 1) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> noise(0.98, 1.02);
  int depth = window.depth();
  for (int i = 0; i < steps; ++i) {
    double ms = step_ms(depth) * noise(random);
    if (i % 25 == 24) ms *= 5;
    depth = window.Record(ms / 1e3);
  }
  return depth;
}

std::function<double(int)> Curve(std::map<int, double> ms) {
  return [ms](int depth) { return ms.at(depth); };
}

TEST(ExchangeWindowTest, ClimbsWhileDeeperIsFaster) {
  // A fast link and long round trips: deeper is faster up to 32.
  ExchangeWindow window{ExchangeWindow::Options()};
  EXPECT_EQ(window.depth(), 8);
  const int depth =
      RunSteps(window, 200, Curve({{2, 40}, {4, 31}, {8, 25}, {16, 21}, {32, 18}, {64, 18.2}}));
  EXPECT_EQ(depth, 32);
  EXPECT_TRUE(window.settled());
  EXPECT_EQ(window.depth(), 32);
  EXPECT_NE(window.last_search().find("32: 1"), std::string::npos) << window.last_search();
}

TEST(ExchangeWindowTest, DescendsWhereTheLinkIsTheBound) {
  // A slow link: deeper windows share it and delay every message.
  ExchangeWindow window{ExchangeWindow::Options()};
  const int depth =
      RunSteps(window, 200, Curve({{2, 52}, {4, 45}, {8, 48}, {16, 60}, {32, 75}, {64, 80}}));
  EXPECT_EQ(depth, 4);
  EXPECT_EQ(window.depth(), 4);
  EXPECT_TRUE(window.settled());
}

TEST(ExchangeWindowTest, StaysWhereNoNeighbourIsClearlyFaster) {
  ExchangeWindow window{ExchangeWindow::Options()};
  const int depth =
      RunSteps(window, 200, Curve({{2, 30}, {4, 25.5}, {8, 25}, {16, 24.8}, {32, 26}, {64, 27}}));
  EXPECT_EQ(depth, 8);
  EXPECT_TRUE(window.settled());
}

TEST(ExchangeWindowTest, SearchesAgainAfterSettling) {
  ExchangeWindow::Options options;
  options.settle_steps = 100;
  ExchangeWindow window(options);
  RunSteps(window, 200, Curve({{2, 40}, {4, 31}, {8, 25}, {16, 21}, {32, 18}, {64, 18.2}}));
  EXPECT_EQ(window.depth(), 32);
  // The link got slower (another job shares it): the window comes down.
  RunSteps(window, 400, Curve({{2, 52}, {4, 45}, {8, 48}, {16, 60}, {32, 75}, {64, 80}}), 2);
  EXPECT_EQ(window.depth(), 4);
}

TEST(ExchangeWindowTest, StaysWithinItsDepths) {
  ExchangeWindow::Options options;
  options.depths = {4, 8};
  options.start = 100;
  ExchangeWindow window(options);
  EXPECT_EQ(window.depth(), 8);
  EXPECT_EQ(RunSteps(window, 100, [](int depth) { return 100.0 / depth; }), 8);
  options.start = 1;
  ExchangeWindow low(options);
  EXPECT_EQ(low.depth(), 4);
}

TEST(ExchangeWindowTest, AFixedWindowNeverMoves) {
  ExchangeWindow window = ExchangeWindow::Fixed(12);
  EXPECT_EQ(RunSteps(window, 500, [](int depth) { return 1000.0 / depth; }), 12);
  EXPECT_FALSE(window.settled());
  EXPECT_EQ(ExchangeWindow::Fixed(0).depth(), 1);
}

}  // namespace
}  // namespace downpour
