// PieceCounter: pre-tokenize documents and count the distinct pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "hashing.h"

namespace tokcore {

class PieceCounterCore {
public:
    explicit PieceCounterCore(int pattern);

    int pattern() const { return pattern_; }

    // Split one document and count its pieces.
    void add(const uint8_t* data, size_t n);
    // Add `count` to a piece (the reduce step of a map-reduce count).
    void add_count(const uint8_t* piece, size_t n, int64_t count);

    size_t size() const { return map_.size(); }
    int64_t total() const { return total_; }

    // Entry indices ordered by piece bytes ascending (memcmp order, shorter prefix first).
    std::vector<uint32_t> sorted_order() const;
    const BytesMap<int64_t>& map() const { return map_; }

private:
    int pattern_;
    BytesMap<int64_t> map_;
    int64_t total_ = 0;
};

}  // namespace tokcore
