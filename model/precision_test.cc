#include "model/precision.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

using kernels::ComputePrecision;
using kernels::Tf32Policy;

void ExpectMaps(Precision precision, ComputePrecision compute, Tf32Policy tf32) {
  const GpuPrecision got = GpuPrecisionOf(precision);
  EXPECT_EQ(got.compute, compute) << Precision_Name(precision);
  EXPECT_EQ(got.tf32, tf32) << Precision_Name(precision);
}

TEST(PrecisionTest, EachPrecisionMapsToItsActivationTypeAndTf32Policy) {
  ExpectMaps(FP32, ComputePrecision::kFp32, Tf32Policy::kConvolutions);
  ExpectMaps(TF32, ComputePrecision::kFp32, Tf32Policy::kConvolutionsAndGemms);
  ExpectMaps(FP32_STRICT, ComputePrecision::kFp32, Tf32Policy::kOff);
  ExpectMaps(BF16, ComputePrecision::kBf16, Tf32Policy::kConvolutions);
  ExpectMaps(FP16, ComputePrecision::kFp16, Tf32Policy::kConvolutions);
}

// A job that says nothing gets PyTorch's default: TF32 convolutions, fp32
// GEMMs.
TEST(PrecisionTest, TheDefaultIsPyTorchsTf32ForConvolutionsOnly) {
  const JobSpec spec;
  EXPECT_EQ(spec.precision(), FP32);
  const GpuPrecision gpu = GpuPrecisionOf(spec.precision());
  EXPECT_EQ(gpu.compute, ComputePrecision::kFp32);
  EXPECT_TRUE(kernels::Tf32Convolutions(gpu.tf32));
  EXPECT_FALSE(kernels::Tf32Gemms(gpu.tf32));
}

TEST(PrecisionTest, OnlyBf16AndFp16AreReduced) {
  const google::protobuf::EnumDescriptor* d = Precision_descriptor();
  for (int i = 0; i < d->value_count(); ++i) {
    const auto precision = static_cast<Precision>(d->value(i)->number());
    EXPECT_EQ(IsReducedPrecision(precision), precision == BF16 || precision == FP16)
        << d->value(i)->name();
  }
}

// Job specs name precisions in text format; the names are the proto's.
TEST(PrecisionTest, NamesParse) {
  for (const char* name : {"FP32", "TF32", "FP32_STRICT", "BF16", "FP16"}) {
    Precision precision = FP32;
    EXPECT_TRUE(Precision_Parse(name, &precision)) << name;
    EXPECT_EQ(Precision_Name(precision), name);
  }
}

}  // namespace
}  // namespace downpour
