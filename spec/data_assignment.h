// How the coordinator shares a job's training data out to its workers
// (JobStatus.data_files and WorkerProgress.data): every record of every file
// is one rank's, and a lost rank's share can be handed on whole or in
// pieces.
#ifndef DOWNPOUR_SPEC_DATA_ASSIGNMENT_H_
#define DOWNPOUR_SPEC_DATA_ASSIGNMENT_H_

#include <string>
#include <vector>

#include "proto/job.pb.h"

namespace downpour {

// The first share of `files` (sorted) among `num_workers` ranks, indexed by
// rank: with at least as many files as ranks, file i whole to rank
// i % num_workers; with fewer, every num_workers-th record of each file,
// from the rank's index. Every record belongs to exactly one rank, and the
// ranks' shares differ by at most one file (or one record per file).
std::vector<std::vector<DataPart>> ShareData(const std::vector<std::string>& files,
                                             int num_workers);

// Deals `parts` out to `receivers` ranks, one part at a time round-robin in
// the given order (put the least loaded first): result[i] goes to the i-th.
std::vector<std::vector<DataPart>> DealParts(const std::vector<DataPart>& parts, int receivers);

}  // namespace downpour

#endif  // DOWNPOUR_SPEC_DATA_ASSIGNMENT_H_
