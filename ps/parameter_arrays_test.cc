#include "ps/parameter_arrays.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"

namespace downpour {
namespace {

std::vector<float> Read(const float* p, int64_t n) { return std::vector<float>(p, p + n); }

// Three elements with momentum's velocity, values 1 2 3, velocity 0.
ParameterArrays Sample() {
  ParameterArrays arrays(3, 1);
  const ParameterArrays::Update init = arrays.PrepareUpdate();
  EXPECT_TRUE(init.in_place());
  for (int i = 0; i < 3; ++i) init.values()[i] = static_cast<float>(i + 1);
  return arrays;
}

OptimizerHyperparams Hp() {
  OptimizerHyperparams hp;
  hp.learning_rate = 0.5f;
  hp.momentum = 0.9f;
  return hp;
}

TEST(ParameterArraysTest, UpdatesInPlaceWhenNothingIsLent) {
  ParameterArrays arrays = Sample();
  const float* before = arrays.values();
  const float grad[3] = {2, 2, 2};
  const ParameterArrays::Update update = arrays.PrepareUpdate();
  EXPECT_TRUE(update.in_place());
  update.Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
  EXPECT_EQ(arrays.values(), before);
  EXPECT_EQ(Read(arrays.values(), 3), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(Read(arrays.slot(0), 3), (std::vector<float>{2, 2, 2}));
}

// A loan sees the arrays as they were lent while updates go on; the update
// writes the same bits as in place; the arrays come back as the spare and
// the next loan's update writes into them (no new arrays).
TEST(ParameterArraysTest, LentArraysStayAsLentAndComeBackAsTheSpare) {
  ParameterArrays arrays = Sample();
  ParameterArrays reference = Sample();
  const ParameterArrays::Loan loan = arrays.Lend();
  const float grad[3] = {2, 4, 6};
  for (ParameterArrays* a : {&arrays, &reference}) {
    a->PrepareUpdate().Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
    a->PrepareUpdate().Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
  }
  EXPECT_EQ(Read(loan.values, 3), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Read(loan.slots[0], 3), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(Read(arrays.values(), 3), Read(reference.values(), 3));
  EXPECT_EQ(Read(arrays.slot(0), 3), Read(reference.slot(0), 3));
  EXPECT_EQ(arrays.retired(), 1);
  EXPECT_FALSE(arrays.has_spare());

  EXPECT_TRUE(arrays.GiveBack(loan.generation).values.empty());
  EXPECT_EQ(arrays.retired(), 0);
  EXPECT_TRUE(arrays.has_spare());
  const ParameterArrays::Loan second = arrays.Lend();
  const ParameterArrays::Update update = arrays.PrepareUpdate();
  EXPECT_FALSE(update.in_place());
  EXPECT_EQ(update.values(), loan.values);  // The spare, reused.
  EXPECT_FALSE(arrays.has_spare());
  update.Keep(0, 3);
  EXPECT_EQ(Read(arrays.values(), 3), Read(second.values, 3));
  arrays.GiveBack(second.generation);
}

// Out of place (blocks streamed to memory) writes the bits in place does,
// over a partial range at an odd start and a length past several blocks.
TEST(ParameterArraysTest, OutOfPlaceWritesWhatInPlaceWould) {
  constexpr int64_t n = 5000;
  ParameterArrays lent(n, 2), reference(n, 2);
  for (ParameterArrays* a : {&lent, &reference}) {
    const ParameterArrays::Update init = a->PrepareUpdate();
    for (int64_t i = 0; i < n; ++i) {
      init.values()[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
      init.slot(0)[i] = 0.01f * static_cast<float>(i % 13);
      init.slot(1)[i] = 0.002f * static_cast<float>(i % 7);
    }
  }
  std::vector<float> grad(n);
  for (int64_t i = 0; i < n; ++i) grad[i] = 0.5f - 0.003f * static_cast<float>(i % 331);
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  hp.step = 4;
  const ParameterArrays::Loan loan = lent.Lend();
  const ParameterArrays::Update update = lent.PrepareUpdate();
  ASSERT_FALSE(update.in_place());
  update.Keep(0, 3);
  update.Apply(OptimizerKind::kAdam, hp, grad.data() + 3, 3, 4000);
  update.Keep(4003, n - 4003);
  reference.PrepareUpdate().Apply(OptimizerKind::kAdam, hp, grad.data() + 3, 3, 4000);
  EXPECT_EQ(Read(lent.values(), n), Read(reference.values(), n));
  EXPECT_EQ(Read(lent.slot(0), n), Read(reference.slot(0), n));
  EXPECT_EQ(Read(lent.slot(1), n), Read(reference.slot(1), n));
  EXPECT_NE(Read(loan.values, n), Read(lent.values(), n));
  lent.GiveBack(loan.generation);
}

// The borrower copies the lent arrays into the spare ones and ends the loan
// early: the next update is in place, and the copy comes back as the spare.
TEST(ParameterArraysTest, CopyEndsTheLoanEarly) {
  ParameterArrays arrays = Sample();
  arrays.ReserveSpare();
  const float* live = arrays.values();
  const ParameterArrays::Loan loan = arrays.Lend();
  ParameterArrays::Arrays copy;
  ASSERT_TRUE(arrays.BeginCopy(loan.generation, &copy));
  EXPECT_FALSE(arrays.has_spare());
  ParameterArrays::CopyLent(loan, 3, &copy);
  ASSERT_TRUE(arrays.EndCopy(loan.generation, &copy));
  EXPECT_EQ(Read(copy.values.data(), 3), (std::vector<float>{1, 2, 3}));
  const float grad[3] = {2, 2, 2};
  const ParameterArrays::Update update = arrays.PrepareUpdate();
  EXPECT_TRUE(update.in_place());
  update.Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
  EXPECT_EQ(arrays.values(), live);
  EXPECT_EQ(Read(copy.values.data(), 3), (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(arrays.ReturnCopy(std::move(copy)).values.empty());
  EXPECT_TRUE(arrays.has_spare());
  EXPECT_EQ(arrays.retired(), 0);
}

// An update that comes while the borrower copies (the spare arrays are out)
// writes new arrays; the loan stays on the arrays it read, and the copy
// becomes the spare.
TEST(ParameterArraysTest, UpdateDuringACopyKeepsTheLoan) {
  ParameterArrays arrays = Sample();
  arrays.ReserveSpare();
  const ParameterArrays::Loan loan = arrays.Lend();
  ParameterArrays::Arrays copy;
  ASSERT_TRUE(arrays.BeginCopy(loan.generation, &copy));
  const float grad[3] = {2, 2, 2};
  const ParameterArrays::Update update = arrays.PrepareUpdate();
  EXPECT_FALSE(update.in_place());
  update.Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
  ParameterArrays::CopyLent(loan, 3, &copy);
  EXPECT_FALSE(arrays.EndCopy(loan.generation, &copy));
  EXPECT_TRUE(copy.values.empty());  // Now the spare.
  EXPECT_TRUE(arrays.has_spare());
  EXPECT_FALSE(arrays.BeginCopy(loan.generation, &copy));  // No longer live.
  EXPECT_EQ(Read(loan.values, 3), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Read(arrays.values(), 3), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(arrays.GiveBack(loan.generation).values.size(), 3u);  // A spare exists: freed.
  EXPECT_EQ(arrays.retired(), 0);
}

// Lent, not updated, given back: no arrays change hands.
TEST(ParameterArraysTest, LoanWithoutUpdateKeepsTheLiveArrays) {
  ParameterArrays arrays = Sample();
  const float* live = arrays.values();
  const ParameterArrays::Loan loan = arrays.Lend();
  EXPECT_EQ(loan.values, live);
  EXPECT_TRUE(arrays.GiveBack(loan.generation).values.empty());
  EXPECT_TRUE(arrays.PrepareUpdate().in_place());
  EXPECT_EQ(arrays.retired(), 0);
}

// Two loans of the same arrays, and a loan of newer ones: each lasts until
// its own GiveBack; arrays freed once a spare exists are handed out.
TEST(ParameterArraysTest, OverlappingLoans) {
  ParameterArrays arrays = Sample();
  arrays.ReserveSpare();
  const ParameterArrays::Loan a = arrays.Lend();
  const ParameterArrays::Loan b = arrays.Lend();
  const float grad[3] = {2, 2, 2};
  arrays.PrepareUpdate().Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);  // Takes the spare.
  const ParameterArrays::Loan c = arrays.Lend();
  arrays.PrepareUpdate().Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);  // New arrays.
  EXPECT_EQ(arrays.retired(), 2);
  EXPECT_TRUE(arrays.GiveBack(a.generation).values.empty());
  EXPECT_EQ(Read(b.values, 3), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Read(c.values, 3), (std::vector<float>{0, 1, 2}));
  EXPECT_TRUE(arrays.GiveBack(b.generation).values.empty());  // Becomes the spare.
  EXPECT_TRUE(arrays.has_spare());
  EXPECT_EQ(arrays.GiveBack(c.generation).values.size(), 3u);  // Freed by the caller.
  EXPECT_EQ(arrays.retired(), 0);
  ParameterArrays reference = Sample();
  for (int step = 0; step < 2; ++step) {
    reference.PrepareUpdate().Apply(OptimizerKind::kMomentum, Hp(), grad, 0, 3);
  }
  EXPECT_EQ(Read(arrays.values(), 3), Read(reference.values(), 3));
}

}  // namespace
}  // namespace downpour
