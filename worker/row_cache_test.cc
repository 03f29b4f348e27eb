#include "worker/row_cache.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// The kept values of `rows` (every one kept) in table 0.
std::vector<float> Get(const RowCache& cache, const std::vector<int64_t>& rows, int64_t dim) {
  std::vector<int32_t> places(rows.size());
  cache.Places(0, rows, places.data());
  std::vector<float> out(rows.size() * dim);
  cache.CopyRows(0, places.data(), static_cast<int64_t>(places.size()), out.data());
  return out;
}

TEST(RowCacheTest, ARowIsReadWhileItsStampIsRecentEnough) {
  RowCache cache({2, 0});
  std::vector<int64_t> missing;
  cache.Missing(0, {7, 9}, 0, &missing);
  EXPECT_THAT(missing, ElementsAre(7, 9));

  const std::vector<float> values = {1, 2, 3, 4};
  cache.Put(0, {7, 9}, values.data(), /*stamp=*/10);
  missing.clear();
  cache.Missing(0, {9, 7, 8}, 10, &missing);
  EXPECT_THAT(missing, ElementsAre(8));
  missing.clear();
  cache.Missing(0, {9, 7}, 11, &missing);  // Too old for a step that needs 11.
  EXPECT_THAT(missing, ElementsAre(9, 7));

  EXPECT_THAT(Get(cache, {9, 7}, 2), ElementsAre(3, 4, 1, 2));

  // A fresher copy replaces the row's values and stamp.
  const std::vector<float> fresher = {5, 6};
  cache.Put(0, {7}, fresher.data(), 12);
  missing.clear();
  cache.Missing(0, {7, 9}, 11, &missing);
  EXPECT_THAT(missing, ElementsAre(9));
  EXPECT_THAT(Get(cache, {7}, 2), ElementsAre(5, 6));
}

TEST(RowCacheTest, DroppedRowsAreForgottenAndTheirPlacesReused) {
  RowCache cache({1});
  const std::vector<float> a = {1, 2, 3};
  cache.Put(0, {1, 2, 3}, a.data(), 5);
  const std::vector<float> b = {4};
  cache.Put(0, {2}, b.data(), 7);
  cache.Drop(0, 6);
  EXPECT_EQ(cache.size(0), 1);
  std::vector<int64_t> missing;
  cache.Missing(0, {1, 2, 3}, 0, &missing);
  EXPECT_THAT(missing, ElementsAre(1, 3));
  // Two freed places hold the next two rows.
  const std::vector<float> c = {8, 9};
  cache.Put(0, {10, 11}, c.data(), 8);
  EXPECT_EQ(cache.size(0), 3);
  EXPECT_THAT(Get(cache, {11, 2, 10}, 1), ElementsAre(9, 4, 8));
  missing.clear();
  cache.Missing(0, {2, 10, 11}, 7, &missing);
  EXPECT_THAT(missing, IsEmpty());
}

// A copy by place (a device's) follows the cache with the places written
// since it last looked: a place written twice is listed once, a freed place
// taken by a new row is listed again, and Places finds each row's.
TEST(RowCacheTest, ACopyByPlaceGetsThePlacesWrittenSinceItLastLooked) {
  RowCache cache({2});
  std::vector<float> copy;  // The copy, by place.
  std::vector<int32_t> written;
  auto follow = [&] {
    cache.TakeWritten(0, &written);
    copy.resize(cache.places(0) * 2);
    for (int32_t place : written) cache.CopyRows(0, &place, 1, copy.data() + place * 2);
  };
  // Rows as the copy holds them: at their places.
  auto read = [&](const std::vector<int64_t>& rows) {
    std::vector<int32_t> places(rows.size());
    cache.Places(0, rows, places.data());
    std::vector<float> out;
    for (int32_t place : places) out.insert(out.end(), {copy[place * 2], copy[place * 2 + 1]});
    return out;
  };
  const std::vector<float> a = {1, 2, 3, 4};
  cache.Put(0, {7, 8}, a.data(), 1);
  const std::vector<float> b = {5, 6};
  cache.Put(0, {8}, b.data(), 2);
  EXPECT_EQ(cache.written(0), 2);
  follow();
  EXPECT_THAT(written, ElementsAre(0, 1));
  EXPECT_THAT(read({8, 7}), ElementsAre(5, 6, 1, 2));
  // The cache's own values, copied by place.
  std::vector<int32_t> places(2);
  cache.Places(0, {8, 7}, places.data());
  std::vector<float> copied(4);
  cache.CopyRows(0, places.data(), 2, copied.data());
  EXPECT_THAT(copied, ElementsAre(5, 6, 1, 2));
  cache.TakeWritten(0, &written);
  EXPECT_THAT(written, IsEmpty());
  // Row 7 dropped; row 9 takes its place.
  cache.Drop(0, 2);
  const std::vector<float> c = {9, 10};
  cache.Put(0, {9}, c.data(), 3);
  follow();
  EXPECT_THAT(written, ElementsAre(0));
  EXPECT_EQ(cache.places(0), 2);
  EXPECT_THAT(read({9, 8}), ElementsAre(9, 10, 5, 6));
}

}  // namespace
}  // namespace downpour
