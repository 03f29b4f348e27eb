#include "spec/data_assignment.h"

namespace downpour {

std::vector<std::vector<DataPart>> ShareData(const std::vector<std::string>& files,
                                             int num_workers) {
  std::vector<std::vector<DataPart>> shares(num_workers);
  const bool whole = static_cast<int>(files.size()) >= num_workers;
  for (size_t f = 0; f < files.size(); ++f) {
    for (int rank = 0; rank < num_workers; ++rank) {
      if (whole && static_cast<int>(f % num_workers) != rank) continue;
      DataPart part;
      part.set_file(files[f]);
      part.set_stride(whole ? 1 : num_workers);
      part.set_offset(whole ? 0 : rank);
      shares[rank].push_back(std::move(part));
    }
  }
  return shares;
}

std::vector<std::vector<DataPart>> DealParts(const std::vector<DataPart>& parts, int receivers) {
  std::vector<std::vector<DataPart>> dealt(receivers);
  if (receivers <= 0) return dealt;
  for (size_t i = 0; i < parts.size(); ++i) dealt[i % receivers].push_back(parts[i]);
  return dealt;
}

}  // namespace downpour
