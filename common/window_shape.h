// WindowShape: a sliding window over a batch of NHWC images, a convolution
// (out_c filters) or a pooling (out_c == in_c). Shape inference (spec/)
// derives one per layer and every kernel backend takes it as is. Element
// (n, h, w, c) of an image is at ((n * H + h) * W + w) * C + c. Output
// (oh, ow) covers input rows oh * stride_h - pad_top + [0, kernel_h) and
// likewise for columns; positions outside the image are padding. Padding at
// the bottom/right is implied by out_h/out_w, so it may differ from
// pad_top/pad_left (TensorFlow's SAME). A plain value.
#ifndef DOWNPOUR_COMMON_WINDOW_SHAPE_H_
#define DOWNPOUR_COMMON_WINDOW_SHAPE_H_

#include <cstdint>

#include "common/host_device.h"

namespace downpour {

struct WindowShape {
  int64_t batch = 0;
  int64_t in_h = 0, in_w = 0, in_c = 0;
  int64_t out_h = 0, out_w = 0, out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;

  DOWNPOUR_HOST_DEVICE int64_t pad_bottom() const {
    return (out_h - 1) * stride_h + kernel_h - in_h - pad_top;
  }
  DOWNPOUR_HOST_DEVICE int64_t pad_right() const {
    return (out_w - 1) * stride_w + kernel_w - in_w - pad_left;
  }
  // Elements of one input / output image.
  DOWNPOUR_HOST_DEVICE int64_t in_elements() const { return in_h * in_w * in_c; }
  DOWNPOUR_HOST_DEVICE int64_t out_elements() const { return out_h * out_w * out_c; }
  // Elements of one convolution filter: kernel_h * kernel_w * in_c.
  DOWNPOUR_HOST_DEVICE int64_t patch_elements() const { return kernel_h * kernel_w * in_c; }
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_WINDOW_SHAPE_H_
