// Conv2dForward/Conv2dBackward against the CPU twin: strict fp32 in each
// layout (NHWC, NCHW, and the measured choice), fp32 with TF32 allowed, and
// bf16/fp16 activations (whose tolerances test_util.h states). Skips, with
// the reason, where there is no CUDA device.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/layers.h"
#include "kernels/cuda/conv_plan.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

// Each layout, with cuDNN's graph API allowed where faster and with the
// legacy algorithms only.
TEST_F(CudaKernelTest, Conv2dForwardAndBackward) {
  uint32_t seed = 10;
  for (bool graph : {true, false})
    for (ConvLayout layout : {ConvLayout::kNhwc, ConvLayout::kNchw, ConvLayout::kAuto}) {
      UseConvLayout(layout);
      if (HasFatalFailure()) return;
      ctx_->conv_graph = graph;
      for (const WindowShape& s : ConvShapes()) {
        SCOPED_TRACE(testing::Message() << "graph " << graph << " layout "
                                        << static_cast<int>(layout) << " in " << Describe(s));
        const ConvOperands o = RandomConvOperands(s, &seed);
        const auto &x = o.x, &w = o.w, &bias = o.bias, &dy = o.dy;
        float *const x_ = o.x_, *const w_ = o.w_, *const bias_ = o.bias_, *const dy_ = o.dy_;
        std::vector<float> workspace(cpu::Conv2dWorkspaceElements(s));
        std::vector<float> y(s.batch * s.out_elements());
        float* y_ = Alloc<float>(y.size());
        const absl::Status forward = cuda::Conv2dForward(ctx(), s, x_, w_, bias_, y_);
        ASSERT_TRUE(forward.ok()) << forward;
        cpu::Conv2dForward(cpu_, s, x.data(), w.data(), bias.data(), y.data(), workspace.data());
        ExpectClose(y, Download(y_, y.size()), "y");

        for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
          auto dx = Random(x.size(), ++seed), dw = Random(w.size(), ++seed),
               db = Random(bias.size(), ++seed);
          float* dx_ = Upload(dx);
          float* dw_ = Upload(dw);
          float* db_ = Upload(db);
          const absl::Status backward =
              cuda::Conv2dBackward(ctx(), s, x_, w_, dy_, dx_, write, dw_, db_, write);
          ASSERT_TRUE(backward.ok()) << backward;
          cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), dx.data(), write, dw.data(),
                              db.data(), write, workspace.data());
          ExpectClose(dx, Download(dx_, dx.size()), "dx");
          ExpectClose(dw, Download(dw_, dw.size()), "dw");
          ExpectClose(db, Download(db_, db.size()), "dbias");
        }
        // No input gradient (first layer), no bias.
        auto dw = Random(w.size(), ++seed);
        float* dw_ = Upload(dw);
        ASSERT_TRUE(cuda::Conv2dBackward<float>(ctx(), s, x_, w_, dy_, nullptr, Write::kOverwrite,
                                                dw_, nullptr, Write::kOverwrite)
                        .ok());
        cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                            dw.data(), nullptr, Write::kOverwrite, workspace.data());
        ExpectClose(dw, Download(dw_, dw.size()), "dw without dx");
      }
    }
}

// A ResNet-like 3x3 convolution of 64 channels, where cuDNN has tensor-core
// kernels to choose.
WindowShape WideShape() {
  WindowShape wide;
  wide.batch = 16;
  wide.in_h = wide.in_w = wide.out_h = wide.out_w = 16;
  wide.in_c = wide.out_c = 64;
  wide.kernel_h = wide.kernel_w = 3;
  wide.stride_h = wide.stride_w = 1;
  wide.pad_top = wide.pad_left = 1;
  return wide;
}

// cuDNN's graph API on its own (conv_graph.h): in each direction,
// overwriting and accumulating, the fastest engine that qualifies computes
// what the CPU twin does: without tensor cores to fp32 rounding
// (Fp32SumTolerance), with them within TF32 rounding.
TEST_F(CudaKernelTest, GraphConvMatchesTheCpu) {
  const WindowShape s = WideShape();
  const ConvGeometry g =
      GeometryOf(s, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, s.in_h, s.in_w, s.pad_top, s.pad_left);
  const int64_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const int64_t w_n = s.out_c * s.patch_elements();
  const size_t workspace_bytes = size_t{64} << 20;
  const ConvScratch scratch = {Alloc<float>(in_n), Alloc<float>(w_n), Alloc<float>(out_n),
                               Alloc<char>(workspace_bytes), workspace_bytes};
  char* workspace = static_cast<char*>(scratch.workspace);
  uint32_t seed = 70;
  const auto x = Random(in_n, ++seed), w = Random(w_n, ++seed), dy = Random(out_n, ++seed);
  const std::vector<float> no_bias(s.out_c, 0.f);
  std::vector<float> cpu_workspace(cpu::Conv2dWorkspaceElements(s));
  float* x_ = Upload(x);
  float* w_ = Upload(w);
  float* dy_ = Upload(dy);
  for (bool tensor_cores : {false, true}) {
    auto tolerance = [&](int64_t k) {
      return tensor_cores ? kTf32Ulps * kTf32UnitRoundoff : Fp32SumTolerance(k);
    };
    auto scale = [&](int64_t k) { return ProductScale(k); };
    for (float beta : {0.f, 1.f}) {
      SCOPED_TRACE(testing::Message() << "tensor cores " << tensor_cores << " beta " << beta);
      const Write write = beta != 0.f ? Write::kAccumulate : Write::kOverwrite;
      auto find = [&](ConvDirection direction) {
        return GraphConv::Find(ctx(), g, direction, beta, tensor_cores, scratch);
      };

      auto forward = find(ConvDirection::kForward);
      ASSERT_TRUE(forward.ok()) << forward.status();
      if (!tensor_cores) EXPECT_FALSE((*forward)->tensor_cores());
      std::vector<float> y = Random(out_n, ++seed), y_cpu(out_n);
      float* y_ = Upload(y);
      ASSERT_OK((*forward)->Run(ctx(), x_, w_, y_, workspace));
      cpu::Conv2dForward(cpu_, s, x.data(), w.data(), no_bias.data(), y_cpu.data(),
                         cpu_workspace.data());
      if (beta != 0.f) {
        for (int64_t i = 0; i < out_n; ++i) y_cpu[i] += y[i];
      }
      ExpectClose(y_cpu, Download(y_, y.size()), "y", tolerance(s.patch_elements()),
                  scale(s.patch_elements()));

      auto filter = find(ConvDirection::kBackwardFilter);
      ASSERT_TRUE(filter.ok()) << filter.status();
      if (!tensor_cores) EXPECT_FALSE((*filter)->tensor_cores());
      std::vector<float> dw = Random(w_n, ++seed);
      float* dw_ = Upload(dw);
      ASSERT_OK((*filter)->Run(ctx(), x_, dw_, dy_, workspace));
      cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                          dw.data(), nullptr, write, cpu_workspace.data());
      const int64_t dw_k = s.batch * s.out_h * s.out_w;
      ExpectClose(dw, Download(dw_, dw.size()), "dw", tolerance(dw_k), scale(dw_k));

      auto data = find(ConvDirection::kBackwardData);
      ASSERT_TRUE(data.ok()) << data.status();
      if (!tensor_cores) EXPECT_FALSE((*data)->tensor_cores());
      std::vector<float> dx = Random(in_n, ++seed), unused_dw(w_n);
      float* dx_ = Upload(dx);
      ASSERT_OK((*data)->Run(ctx(), dx_, w_, dy_, workspace));
      cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), dx.data(), write,
                          unused_dw.data(), nullptr, Write::kOverwrite, cpu_workspace.data());
      const int64_t dx_k = s.out_c * s.kernel_h * s.kernel_w;
      ExpectClose(dx, Download(dx_, dx.size()), "dx", tolerance(dx_k), scale(dx_k));
    }
  }
  // A pointer off the declared alignment is refused, not run.
  auto forward = GraphConv::Find(ctx(), g, ConvDirection::kForward, 0.f, false, scratch);
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ((*forward)->Run(ctx(), x_ + 1, w_, scratch.y, workspace).code(),
            absl::StatusCode::kFailedPrecondition);
}

// The Tf32Policy reaches cuDNN: a strict context keeps FMA algorithms and
// graph engines without tensor cores only (and matches the CPU to fp32
// rounding, Fp32SumTolerance); one that allows TF32 convolutions keeps
// whatever measured fastest, never a math type that converts fp32 to fp16,
// and stays within TF32 rounding of the CPU. Besides the small
// shapes, a ResNet-like 3x3 convolution of 64 channels, where cuDNN has
// TF32 tensor-core kernels to choose.
TEST_F(CudaKernelTest, Conv2dMathFollowsTheTf32Policy) {
  std::vector<WindowShape> shapes = ConvShapes();
  shapes.push_back(WideShape());
  uint32_t seed = 50;
  for (Tf32Policy policy : {Tf32Policy::kOff, Tf32Policy::kConvolutions}) {
    UseConvLayout(ConvLayout::kAuto);
    if (HasFatalFailure()) return;
    ctx_->tf32 = policy;
    const bool strict = policy == Tf32Policy::kOff;
    int tensor_op = 0, directions = 0, graph_plans = 0;
    for (const WindowShape& s : shapes) {
      SCOPED_TRACE(testing::Message()
                   << "tf32 policy " << static_cast<int>(policy) << " in " << Describe(s));
      // Tolerances as test_util.h says, relative to the size of each
      // result's sum of products: strict fp32 summed in cuDNN's order, or
      // TF32.
      auto tolerance = [&](int64_t k) {
        return strict ? Fp32SumTolerance(k) : kTf32Ulps * kTf32UnitRoundoff;
      };
      auto scale = [&](int64_t k) { return ProductScale(k); };
      const ConvOperands o = RandomConvOperands(s, &seed);
      const auto &x = o.x, &w = o.w, &bias = o.bias, &dy = o.dy;
      float *const x_ = o.x_, *const w_ = o.w_, *const bias_ = o.bias_, *const dy_ = o.dy_;
      std::vector<float> workspace(cpu::Conv2dWorkspaceElements(s));
      std::vector<float> y(s.batch * s.out_elements());
      float* y_ = Alloc<float>(y.size());
      ASSERT_OK(cuda::Conv2dForward(ctx(), s, x_, w_, bias_, y_));
      cpu::Conv2dForward(cpu_, s, x.data(), w.data(), bias.data(), y.data(), workspace.data());
      ExpectClose(y, Download(y_, y.size()), "y", tolerance(s.patch_elements()),
                  scale(s.patch_elements()));
      auto dx = Random(x.size(), ++seed), dw = Random(w.size(), ++seed),
           db = Random(bias.size(), ++seed);
      float* dx_ = Upload(dx);
      float* dw_ = Upload(dw);
      float* db_ = Upload(db);
      ASSERT_OK(cuda::Conv2dBackward(ctx(), s, x_, w_, dy_, dx_, Write::kAccumulate, dw_, db_,
                                     Write::kAccumulate));
      cpu::Conv2dBackward(cpu_, s, x.data(), w.data(), dy.data(), dx.data(), Write::kAccumulate,
                          dw.data(), db.data(), Write::kAccumulate, workspace.data());
      const int64_t dx_k = s.out_c * s.kernel_h * s.kernel_w, dw_k = s.batch * s.out_h * s.out_w;
      ExpectClose(dx, Download(dx_, dx.size()), "dx", tolerance(dx_k), scale(dx_k));
      ExpectClose(dw, Download(dw_, dw.size()), "dw", tolerance(dw_k), scale(dw_k));
      ExpectClose(db, Download(db_, db.size()), "dbias");  // Column sums: fp32 either way.

      absl::StatusOr<ConvPlan*> plan = PlanFor(ctx(), s);
      ASSERT_TRUE(plan.ok()) << plan.status();
      for (const ConvVariant* v : {&(*plan)->nhwc, &(*plan)->nchw}) {
        for (cudnnMathType_t math : {v->fwd_math, v->bwd_filter_math, v->bwd_data_math}) {
          ++directions;
          if (strict) {
            EXPECT_EQ(math, CUDNN_FMA_MATH);
          } else {
            EXPECT_NE(math, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
            tensor_op += math != CUDNN_FMA_MATH;
          }
        }
        // A graph plan kept in strict fp32 never runs on tensor cores.
        for (const GraphConv* g :
             {v->fwd_graph.get(), v->bwd_filter_graph[0].get(), v->bwd_filter_graph[1].get(),
              v->bwd_data_graph[0].get(), v->bwd_data_graph[1].get()}) {
          if (g == nullptr) continue;
          ++graph_plans;
          if (strict) EXPECT_FALSE(g->tensor_cores()) << "engine " << g->engine();
        }
      }
    }
    // Which math cuDNN preferred, and whether a graph engine was faster, is
    // its choice, not ours: reported only.
    std::printf(
        "tf32 policy %d: %d of %d measured directions (both layouts) in a math type "
        "that permits tensor ops; %d graph plans kept\n",
        static_cast<int>(policy), tensor_op, directions, graph_plans);
  }
}

TYPED_TEST_SUITE(ReducedKernelTest, ReducedTypes, ReducedNames);

TYPED_TEST(ReducedKernelTest, ActivationsOfAnotherTypeAreInvalidArgument) {
  using T = TypeParam;
  using Other = typename Reduced<T>::Other;
  const WindowShape s = ConvShapes()[2];
  const size_t in_n = s.batch * s.in_elements(), out_n = s.batch * s.out_elements();
  const size_t w_n = s.out_c * s.patch_elements();
  float* x = this->AllocF(in_n);
  float* y = this->AllocF(out_n);
  float* w = this->AllocF(w_n);
  float* dw = this->AllocF(w_n);
  const CudaContext& ctx = this->ctx();
  ASSERT_EQ(cudaMemsetAsync(x, 0, in_n * sizeof(float), ctx.stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(w, 0, w_n * sizeof(float), ctx.stream), cudaSuccess);
  const auto invalid = absl::StatusCode::kInvalidArgument;
  // Dense [batch, 5] x [5, 4] in the same buffers.
  EXPECT_EQ(cuda::DenseForward<float>(ctx, s.batch, 5, 4, x, w, nullptr, y).code(), invalid);
  EXPECT_EQ(cuda::DenseBackward<float>(ctx, s.batch, 5, 4, x, w, y, x, Write::kOverwrite, dw,
                                       nullptr, Write::kOverwrite)
                .code(),
            invalid);
  EXPECT_EQ(cuda::Conv2dForward<float>(ctx, s, x, w, nullptr, y).code(), invalid);
  EXPECT_EQ(cuda::Conv2dBackward<float>(ctx, s, x, w, y, x, Write::kOverwrite, dw, nullptr,
                                        Write::kOverwrite)
                .code(),
            invalid);
  auto* xo = reinterpret_cast<Other*>(x);
  auto* yo = reinterpret_cast<Other*>(y);
  EXPECT_EQ(cuda::DenseForward<Other>(ctx, s.batch, 5, 4, xo, w, nullptr, yo).code(), invalid);
  EXPECT_EQ(cuda::Conv2dForward<Other>(ctx, s, xo, w, nullptr, yo).code(), invalid);
  // The context's own type, on the same (zeroed) buffers, is fine.
  auto* xt = reinterpret_cast<T*>(x);
  auto* yt = reinterpret_cast<T*>(y);
  ASSERT_OK(cuda::DenseForward<T>(ctx, s.batch, 5, 4, xt, w, nullptr, yt));
  ASSERT_OK(cuda::Conv2dForward<T>(ctx, s, xt, w, nullptr, yt));
}

TYPED_TEST(ReducedKernelTest, Conv2dForwardAndBackward) {
  using T = TypeParam;
  const CudaContext& ctx = this->ctx();
  uint32_t seed = 10;
  for (const WindowShape& s : ConvShapes()) {
    SCOPED_TRACE(Describe(s));
    const auto x = TestFixture::RandomT(s.batch * s.in_elements(), ++seed);
    const auto w = TestFixture::RandomT(s.out_c * s.patch_elements(), ++seed);
    const auto bias = TestFixture::RandomT(s.out_c, ++seed);
    const auto dy = TestFixture::RandomT(s.batch * s.out_elements(), ++seed);
    std::vector<float> workspace(cpu::Conv2dWorkspaceElements(s));
    T* x_ = this->UploadT(x);
    float* w_ = this->Upload(w);
    float* bias_ = this->Upload(bias);
    T* dy_ = this->UploadT(dy);
    T* y_ = this->AllocT(dy.size());
    const double forward_scale = ProductScale(s.patch_elements());
    for (const auto& [with_bias, relu] :
         std::vector<std::pair<bool, bool>>{{true, false}, {true, true}, {false, false}}) {
      std::vector<float> y(dy.size());
      ASSERT_OK(cuda::Conv2dForward(ctx, s, x_, w_, with_bias ? bias_ : nullptr, y_, relu));
      cpu::Conv2dForward(this->cpu_, s, x.data(), w.data(), with_bias ? bias.data() : nullptr,
                         y.data(), workspace.data());
      if (relu) cpu::ReluForward(this->cpu_, y.size(), y.data(), y.data());
      const char* what = relu ? "y (relu)" : with_bias ? "y" : "y without bias";
      this->Expect(y, y_, what, kProductUlps, forward_scale);
    }
    // Each input gradient sums at most out_c * kernel_h * kernel_w products,
    // each filter gradient batch * out_h * out_w.
    const double dx_scale = ProductScale(s.out_c * s.kernel_h * s.kernel_w);
    const double dw_scale = ProductScale(s.batch * s.out_h * s.out_w);
    const double dw_tolerance = kProductUlps * TestFixture::u;
    for (Write write : {Write::kOverwrite, Write::kAccumulate}) {
      auto dx = TestFixture::RandomT(x.size(), ++seed);
      auto dw = Random(w.size(), ++seed), db = Random(bias.size(), ++seed);
      T* dx_ = this->UploadT(dx);
      float* dw_ = this->Upload(dw);
      float* db_ = this->Upload(db);
      ASSERT_OK(cuda::Conv2dBackward(ctx, s, x_, w_, dy_, dx_, write, dw_, db_, write));
      cpu::Conv2dBackward(this->cpu_, s, x.data(), w.data(), dy.data(), dx.data(), write, dw.data(),
                          db.data(), write, workspace.data());
      this->Expect(dx, dx_, "dx", kProductUlps, dx_scale);
      ExpectClose(dw, this->Download(dw_, dw.size()), "dw", dw_tolerance, dw_scale);
      ExpectClose(db, this->Download(db_, db.size()), "dbias");
    }
    // No input gradient (first layer), no bias.
    auto dw = Random(w.size(), ++seed);
    float* dw_ = this->Upload(dw);
    ASSERT_OK(cuda::Conv2dBackward<T>(ctx, s, x_, w_, dy_, nullptr, Write::kOverwrite, dw_, nullptr,
                                      Write::kOverwrite));
    cpu::Conv2dBackward(this->cpu_, s, x.data(), w.data(), dy.data(), nullptr, Write::kOverwrite,
                        dw.data(), nullptr, Write::kOverwrite, workspace.data());
    ExpectClose(dw, this->Download(dw_, dw.size()), "dw without dx", dw_tolerance, dw_scale);
  }
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
