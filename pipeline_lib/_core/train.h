// BPE training (learn_merges), equal merge for merge to bpe_reference.learn_merges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tokcore {

// Called as progress(done, n_merges); may throw to abort training.
using ProgressFn = std::function<void(size_t, size_t)>;

struct TrainInput {
    std::vector<uint8_t> bytes;      // all pieces back to back
    std::vector<uint64_t> offsets;   // piece k is bytes[offsets[k] .. offsets[k + 1])
    std::vector<int64_t> counts;     // count of piece k
};

// Learn up to n_merges merges. Returns rows (left_id, right_id, merged_id) flattened.
// Duplicate pieces: the last count wins (as dict(zip(pieces, counts)) does).
// Counts must be >= 0. A pair whose merged token would be longer than max_token_bytes is
// never merged (0 = no limit). progress (if set) is called every `progress_every` merges
// and at the end.
std::vector<int32_t> learn_merges(const TrainInput& input, size_t n_merges, int64_t min_frequency,
                                  const ProgressFn& progress, size_t max_token_bytes = 0,
                                  size_t progress_every = 1000);

}  // namespace tokcore
