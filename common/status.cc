#include "common/status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace downpour {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&annotated](absl::string_view type_url, const absl::Cord& value) {
    annotated.SetPayload(type_url, value);
  });
  return annotated;
}

absl::Status MarkDiverged(absl::Status status) {
  status.SetPayload(kDivergedTypeUrl, absl::Cord());
  return status;
}

bool IsDiverged(const absl::Status& status) {
  return status.GetPayload(kDivergedTypeUrl).has_value();
}

}  // namespace downpour
