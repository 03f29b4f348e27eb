#include "spec/onnx_tensor.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "spec/model_shape.h"

namespace downpour {
namespace {

using onnx::TensorProto;

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24.
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                 : sign | ((exponent + 112u) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float BfloatToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One element type of TensorProto: its size, and how its values read.
absl::StatusOr<int> ElementBytes(int type) {
  switch (type) {
    case TensorProto::FLOAT:
    case TensorProto::INT32:
      return 4;
    case TensorProto::DOUBLE:
    case TensorProto::INT64:
      return 8;
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
      return 2;
    case TensorProto::BOOL:
    case TensorProto::UINT8:
    case TensorProto::INT8:
      return 1;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("element type ", onnx::TensorProto_DataType_Name(type), " is not read"));
  }
}

}  // namespace

bool IsOnnxFloatType(int type) {
  return type == TensorProto::FLOAT || type == TensorProto::DOUBLE ||
         type == TensorProto::FLOAT16 || type == TensorProto::BFLOAT16;
}

// The values of `t`, checked against its dims (sizes from the file are
// never trusted before that).
absl::StatusOr<OnnxConst> ReadOnnxTensor(const onnx::TensorProto& t) {
  OnnxConst c;
  c.name = t.name();
  if (t.data_location() == TensorProto::EXTERNAL || t.external_data_size() > 0) {
    return absl::InvalidArgumentError(
        "its data is stored outside the file (external data); save the model with its weights "
        "inside (onnx.save_model(..., save_as_external_data=False))");
  }
  if (t.has_segment()) return absl::InvalidArgumentError("segmented tensors are not read");
  for (int64_t d : t.dims()) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " is negative"));
    c.dims.push_back(d);
  }
  const int64_t n = c.dims.empty() ? 1 : CheckedProduct(c.dims);
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(c.dims), " has more than 2^31-1 elements"));
  }
  ASSIGN_OR_RETURN(const int bytes, ElementBytes(t.data_type()));
  c.integer = !IsOnnxFloatType(t.data_type());
  const int type = t.data_type();
  // Integer tensors are shapes, axes and indices: a large one is no model's.
  if (c.integer && n > kMaxOnnxIntegerElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an integer tensor of ", n, " elements; integer constants (shapes, axes) have at most ",
        kMaxOnnxIntegerElements));
  }
  // The values are allocated only once the file is known to hold them all.
  const int have = t.has_raw_data()              ? -1
                   : type == TensorProto::FLOAT  ? t.float_data_size()
                   : type == TensorProto::DOUBLE ? t.double_data_size()
                   : type == TensorProto::INT64  ? t.int64_data_size()
                                                 : t.int32_data_size();
  if (t.has_raw_data() && t.raw_data().size() != static_cast<size_t>(n) * bytes) {
    return absl::InvalidArgumentError(absl::StrCat("raw_data has ", t.raw_data().size(),
                                                   " bytes; shape ", ShapeString(c.dims), " needs ",
                                                   n * bytes));
  }
  if (!t.has_raw_data() && have != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("has ", have, " values; shape ", ShapeString(c.dims), " needs ", n));
  }
  auto store = [&](int64_t k, double v, int64_t iv) {
    if (c.integer) {
      c.i[k] = iv;
    } else {
      c.f[k] = static_cast<float>(v);
    }
  };
  if (c.integer) {
    c.i.assign(n, 0);
  } else {
    c.f.assign(n, 0.f);
  }
  if (t.has_raw_data()) {
    const std::string& raw = t.raw_data();
    const char* p = raw.data();
    for (int64_t k = 0; k < n; ++k, p += bytes) {
      switch (type) {
        case TensorProto::FLOAT: {
          float v;
          std::memcpy(&v, p, 4);
          store(k, v, 0);
          break;
        }
        case TensorProto::DOUBLE: {
          double v;
          std::memcpy(&v, p, 8);
          store(k, v, 0);
          break;
        }
        case TensorProto::FLOAT16:
        case TensorProto::BFLOAT16: {
          uint16_t v;
          std::memcpy(&v, p, 2);
          store(k, type == TensorProto::FLOAT16 ? HalfToFloat(v) : BfloatToFloat(v), 0);
          break;
        }
        case TensorProto::INT64: {
          int64_t v;
          std::memcpy(&v, p, 8);
          store(k, 0, v);
          break;
        }
        case TensorProto::INT32: {
          int32_t v;
          std::memcpy(&v, p, 4);
          store(k, 0, v);
          break;
        }
        case TensorProto::INT8:
          store(k, 0, static_cast<int8_t>(*p));
          break;
        default:  // BOOL, UINT8.
          store(k, 0, static_cast<uint8_t>(*p));
      }
    }
    return c;
  }
  // The typed fields: each type has one, holding n values (checked above).
  switch (type) {
    case TensorProto::FLOAT:
      for (int64_t k = 0; k < n; ++k) c.f[k] = t.float_data(k);
      break;
    case TensorProto::DOUBLE:
      for (int64_t k = 0; k < n; ++k) c.f[k] = static_cast<float>(t.double_data(k));
      break;
    case TensorProto::INT64:
      for (int64_t k = 0; k < n; ++k) c.i[k] = t.int64_data(k);
      break;
    default:  // Held in int32_data (16-bit floats as their bits).
      for (int64_t k = 0; k < n; ++k) {
        const int32_t v = t.int32_data(k);
        if (type == TensorProto::FLOAT16) {
          c.f[k] = HalfToFloat(static_cast<uint16_t>(v));
        } else if (type == TensorProto::BFLOAT16) {
          c.f[k] = BfloatToFloat(static_cast<uint16_t>(v));
        } else {
          c.i[k] = v;
        }
      }
  }
  return c;
}

absl::StatusOr<OnnxConst> ReadOnnxConstant(const onnx::NodeProto& node) {
  using onnx::AttributeProto;
  const AttributeProto* a = node.attribute_size() == 1 ? &node.attribute(0) : nullptr;
  if (a == nullptr) return absl::InvalidArgumentError("does not have exactly one attribute");
  OnnxConst out;
  if (a->name() == "value" && a->type() == AttributeProto::TENSOR) {
    return ReadOnnxTensor(a->t());
  } else if (a->name() == "value_int" && a->type() == AttributeProto::INT) {
    out.integer = true;
    out.i = {a->i()};
  } else if (a->name() == "value_ints" && a->type() == AttributeProto::INTS) {
    out.integer = true;
    out.i.assign(a->ints().begin(), a->ints().end());
    out.dims = {static_cast<int64_t>(out.i.size())};
  } else if (a->name() == "value_float" && a->type() == AttributeProto::FLOAT) {
    out.f = {a->f()};
  } else if (a->name() == "value_floats" && a->type() == AttributeProto::FLOATS) {
    out.f.assign(a->floats().begin(), a->floats().end());
    out.dims = {static_cast<int64_t>(out.f.size())};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("attribute ", a->name(), " is not read"));
  }
  return out;
}

absl::StatusOr<OnnxConst> FoldOnnxShapeOp(const std::string& op,
                                          const std::vector<const OnnxConst*>& in) {
  size_t elements = 0;
  for (const OnnxConst* c : in) {
    if (!c->integer || c->dims.size() > 1) {
      return absl::InvalidArgumentError(
          "folding it over constants is supported for integer scalars and vectors only");
    }
    elements += c->i.size();
  }
  // Shapes and axes are short; a Concat of Concats doubling a vector is not.
  if (elements > kMaxOnnxFoldedElements) {
    return absl::InvalidArgumentError(absl::StrCat("folds ", elements,
                                                   " integers; shape "
                                                   "arithmetic takes at most ",
                                                   kMaxOnnxFoldedElements));
  }
  OnnxConst out;
  out.integer = true;
  if (op == "Gather" && in.size() == 2) {
    out.dims = in[1]->dims;
    const int64_t n = static_cast<int64_t>(in[0]->i.size());
    for (int64_t k : in[1]->i) {
      if (k < -n || k >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("index ", k, " is outside [", -n, ", ", n, ")"));
      }
      out.i.push_back(in[0]->i[k < 0 ? k + n : k]);
    }
  } else if ((op == "Unsqueeze" || op == "Squeeze" || op == "Cast") && !in.empty()) {
    out.i = in[0]->i;
    out.dims = in[0]->dims;
    // A scalar becomes [1], and back.
    if (op == "Unsqueeze") out.dims = {static_cast<int64_t>(out.i.size())};
    if (op == "Squeeze" && out.i.size() == 1) out.dims.clear();
  } else if (op == "Concat") {
    for (const OnnxConst* c : in) out.i.insert(out.i.end(), c->i.begin(), c->i.end());
    out.dims = {static_cast<int64_t>(out.i.size())};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("op ", op, " over constants is not folded (only shape arithmetic: Shape, ",
                     "Gather, Unsqueeze, Squeeze, Concat, Cast, and Identity)"));
  }
  return out;
}

}  // namespace downpour
