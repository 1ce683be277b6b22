#include "counter.h"

#include <algorithm>
#include <cstring>

#include "cancel.h"
#include "pretokenize.h"

namespace tokcore {

PieceCounterCore::PieceCounterCore(int pattern) : pattern_(pattern), map_(1 << 12) {}

void PieceCounterCore::add(const uint8_t* data, size_t n) {
    int64_t pieces = 0;
    cancel::Poll& poll = cancel::current();
    size_t polled = 0;  // bytes handed to the poll so far, in steps of >= kPollBytes rather than per piece
    Recent* const recent = recent_.data();
    // Inlined into the split loop: a call per piece costs as much as the lookup.
    pretok::split_with(data, n, pattern_, [&](size_t b, size_t e, auto ascii) __attribute__((always_inline)) {
        ++pieces;
        if (e - polled >= pretok::kPollBytes) {
            poll.tick(e - polled);
            polled = e;
        }
        if constexpr (decltype(ascii)::value) {
            const uint8_t* p = data + b;
            const size_t len = e - b;
            const auto [head, tail] = pretok::word_key(p, len);
            Recent& r = recent[pretok::word_key_slot(head, tail, kRecentBits)];
            if (r.len == len && r.head == head && r.tail == tail) {
                ++map_.entries()[r.entry].value;
                return;
            }
            int64_t& count = map_.get_or_insert(Key(p, len), int64_t{0});
            ++count;
            r = Recent{head, tail, static_cast<uint32_t>(len), static_cast<uint32_t>(map_.index_of(count))};
        } else {
            ++map_.get_or_insert(Key(data + b, e - b), int64_t{0});
        }
    });
    poll.tick(n - polled);
    total_ += pieces;
}

void PieceCounterCore::add_count(const uint8_t* piece, size_t n, int64_t count) {
    map_.get_or_insert(piece, n, int64_t{0}) += count;
    total_ += count;
}

std::vector<uint32_t> PieceCounterCore::sorted_order() const {
    const auto& es = map_.entries();
    std::vector<uint32_t> order(es.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<uint32_t>(k);
    cancel::Poll& poll = cancel::current();
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        poll.tick();
        const auto& ea = es[a];
        const auto& eb = es[b];
        const size_t m = std::min(ea.len, eb.len);
        const int c = m ? std::memcmp(map_.key_data(ea), map_.key_data(eb), m) : 0;
        return c != 0 ? c < 0 : ea.len < eb.len;
    });
    return order;
}

}  // namespace tokcore
