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
    // Recent ASCII pieces (pretok::ascii_piece_end's; <= 15 bytes): (first 8 bytes, last 8 bytes,
    // length) -> their entry in map_, direct-mapped. A hit counts the piece without hashing it
    // or probing the map, as the encoder's PieceCache::words gives ids.
    struct Recent {
        uint64_t head;
        uint64_t tail;
        uint32_t len;  // 0: empty
        uint32_t entry;
    };
    static constexpr size_t kRecentBits = 15;
    std::vector<Recent> recent_ = std::vector<Recent>(size_t{1} << kRecentBits, Recent{0, 0, 0, 0});
};

}  // namespace tokcore
