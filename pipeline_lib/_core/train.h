// BPE training (learn_merges), equal merge for merge to bpe_reference.learn_merges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tokcore {

// Called as progress(done, n_merges); may throw to abort training.
using ProgressFn = std::function<void(size_t, size_t)>;

// Pieces are sequences of symbols of an initial alphabet (symbol id -> token bytes). Byte-level
// BPE is the case of the 256 bytes, its pieces given as bytes; character-level and word BPE
// give their alphabet (characters, an end-of-word symbol) and pieces as symbol ids.
struct TrainInput {
    std::vector<std::string> alphabet;  // symbol id -> bytes; empty: the 256 single bytes
    std::vector<uint8_t> bytes;         // byte pieces back to back (alphabet empty)
    std::vector<int32_t> symbols;       // symbol pieces back to back (alphabet given)
    std::vector<uint64_t> offsets;      // piece k is [offsets[k], offsets[k + 1]) of the above
    std::vector<int64_t> counts;        // count of piece k
};

struct Merges {
    std::vector<int32_t> rows;    // (left_id, right_id, merged_id) flattened, in the order learned
    std::vector<int64_t> counts;  // the merged pair's count when it was merged
};

// Learn up to n_merges merges; new ids follow the alphabet's. Duplicate pieces: the last count
// wins (as dict(zip(pieces, counts)) does). Counts must be >= 0; symbols must be alphabet ids
// and the alphabet's bytes distinct. A pair whose merged token would be longer than
// max_token_bytes is never merged (0 = no limit). progress (if set) is called every
// `progress_every` merges and at the end.
// Ties between equal counts: the pair whose (left bytes, right bytes) sorts first, or, with
// first_seen, the pair whose first occurrence comes first (pieces in the order given, then
// left to right), as the tutorials' max(pairs, key=pairs.get) over a dict filled in text order.
Merges learn_merges(const TrainInput& input, size_t n_merges, int64_t min_frequency, const ProgressFn& progress,
                    size_t max_token_bytes = 0, size_t progress_every = 1000, bool first_seen = false);

}  // namespace tokcore
