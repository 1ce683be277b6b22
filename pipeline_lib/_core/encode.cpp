#include "encode.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "cancel.h"
#include "pool.h"
#include "pretokenize.h"
#include "small_merge.h"
#include "utf8_units.h"

namespace tokcore {

namespace {
// Pieces up to kSmallPiece bytes use the simple O(n^2) array merge (tiktoken's shape, fast
// for short pieces); up to kHugePiece a linked list + binary min-heap, O(n log n); longer
// ones a linked list + bucket queue by rank (BucketQueue), close to linear. They run on
// initial token ids, so the same code serves pieces that start as bytes or as characters.
constexpr size_t kSmallPiece = 64;
constexpr size_t kHugePiece = size_t{1} << 16;
// Pieces from kPeriodicPiece bytes on that repeat a unit of up to kMaxPeriod bytes (a run of
// spaces, of one letter, a repeated pattern) take bpe_periodic; its windows stay below
// kPeriodicPiece, so it never calls itself.
constexpr size_t kPeriodicPiece = size_t{1} << 12;
constexpr size_t kMaxPeriod = 64;
// A batch's output of this many ids or more is copied together by its threads (encode_batch).
constexpr size_t kParallelCopyIds = size_t{1} << 17;
// The buffer a thread makes a str document's UTF-8 in is kept for its next one up to this size.
constexpr size_t kKeptUtf8 = size_t{1} << 20;
// A vocabulary of this many tokens or more fills its token tables on a second thread.
constexpr size_t kParallelBuildTokens = size_t{1} << 14;

// The few ids of a piece appended one by one: vector::insert's general path cost ~30
// instructions more a call (callgrind), its range check and its call to memmove.
inline void append_ids(std::vector<uint32_t>& v, const uint32_t* first, const uint32_t* last) {
    for (; first != last; ++first) v.push_back(*first);
}
}  // namespace

namespace {

// Proper prefixes (or, reversed, suffixes) of each token that are tokens themselves: the tokens
// sorted (read in that direction) by `AffixOrder::sorted`, then walked by `visit_affixes`, which
// calls visit(rank, length, stack) once per token, where stack lists them as (length, rank),
// shortest first; ahead(r8, r4) names the tokens visited 8 and 4 later (to prefetch what visit
// will read). Token r's bytes are arena[off[r] .. off[r] + length).
//
// In sorted order a token's prefixes come before it, and all of them are prefixes of its
// predecessor in the order too, so a stack of "the tokens that are prefixes of the previous
// token" is all it takes: pop the entries longer than the common prefix of the previous token
// and this one, and what is left are this token's prefixes. O(total bytes) besides the sort;
// trying every cut of every token against a hash map instead hashes every prefix,
// O(length^2) per token (minutes for a 1 MB token).
struct Affix {
    uint32_t len;
    uint32_t rank;
};

struct AffixOrder {
    // The first 8 bytes as a big-endian key (short tokens padded with zeros) decide most
    // comparisons and common prefixes without touching the bytes.
    struct Item {
        uint64_t key;
        uint32_t rank;
        uint32_t len;
    };
    const char* arena;
    const std::vector<uint64_t>& off;
    bool reversed;

    uint8_t byte_at(const Item& x, size_t i) const {
        return static_cast<uint8_t>(arena[off[x.rank] + (reversed ? x.len - 1 - i : i)]);
    }
    // Equal keys: a token of <= 8 bytes is then a prefix of the other one.
    size_t common_prefix(const Item& x, const Item& y) const {
        const size_t m = std::min(x.len, y.len);
        if (x.key != y.key) return std::min<size_t>(static_cast<size_t>(__builtin_clzll(x.key ^ y.key)) / 8, m);
        size_t i = std::min<size_t>(8, m);
        while (i < m && byte_at(x, i) == byte_at(y, i)) ++i;
        return i;
    }
    bool less(const Item& x, const Item& y) const {
        if (x.key != y.key) return x.key < y.key;
        const size_t i = common_prefix(x, y);
        if (i == std::min(x.len, y.len)) return x.len < y.len;
        return byte_at(x, i) < byte_at(y, i);
    }

    std::vector<Item> sorted(const std::vector<std::string>& tokens, const std::vector<uint32_t>& ranks) const {
        cancel::Poll& poll = cancel::current();
        std::vector<Item> items(tokens.size());
        for (size_t k = 0; k < tokens.size(); ++k) {
            const std::string& t = tokens[k];
            const size_t n = t.size();
            uint64_t key = 0;
            if (n >= 8) {
                // little-endian loads: the first 8 bytes byte-swapped, or the last 8 as they are
                std::memcpy(&key, t.data() + (reversed ? n - 8 : 0), 8);
                if (!reversed) key = __builtin_bswap64(key);
            } else {
                for (size_t i = 0; i < 8; ++i)
                    key = (key << 8) | (i < n ? static_cast<uint8_t>(t[reversed ? n - 1 - i : i]) : 0);
            }
            items[k] = Item{key, ranks[k], static_cast<uint32_t>(n)};
        }
        // Radix sort by key (least significant byte first, so stable), then runs of equal keys
        // by their bytes: a few times faster than comparison sorting the whole vocabulary.
        std::vector<std::array<size_t, 256>> count(8);
        for (auto& c : count) c.fill(0);
        for (const Item& it : items)
            for (int b = 0; b < 8; ++b) ++count[b][(it.key >> (8 * b)) & 255];
        std::vector<Item> tmp(items.size());
        for (int b = 0; b < 8; ++b) {
            std::array<size_t, 256>& c = count[b];
            if (*std::max_element(c.begin(), c.end()) == items.size()) continue;  // one value: nothing moves
            poll.tick(items.size());
            size_t at = 0;
            for (size_t& v : c) at += std::exchange(v, at);
            for (const Item& it : items) tmp[c[(it.key >> (8 * b)) & 255]++] = it;
            items.swap(tmp);
        }
        for (size_t i = 0, j; i < items.size(); i = j) {
            for (j = i + 1; j < items.size() && items[j].key == items[i].key;) ++j;
            if (j - i > 1) {
                poll.tick(16 * (j - i));  // ~n log n comparisons
                std::sort(items.begin() + i, items.begin() + j,
                          [this](const Item& x, const Item& y) { return less(x, y); });
            }
        }
        return items;
    }
};

// `work` on a thread of its own, when `wanted` and a thread is to be had (started()): joined
// however the scope that holds it is left (a stop, a bad vocabulary); join() rethrows what the
// work threw (e.g. bad_alloc).
class SideThread {
public:
    template <class Work>
    SideThread(bool wanted, Work&& work) {
        if (!wanted) return;
        try {
            thread_.emplace([this, work = std::forward<Work>(work)]() mutable {
                try {
                    work();
                } catch (...) {
                    failed_ = std::current_exception();
                }
            });
        } catch (const std::system_error&) {  // no thread to be had: the caller does the work
        }
    }
    SideThread(const SideThread&) = delete;
    SideThread& operator=(const SideThread&) = delete;
    ~SideThread() {
        if (thread_ && thread_->joinable()) thread_->join();
    }
    bool started() const { return thread_.has_value(); }
    void join() {
        if (thread_ && thread_->joinable()) thread_->join();
        if (failed_) std::rethrow_exception(failed_);
    }

private:
    std::optional<std::thread> thread_;
    std::exception_ptr failed_;
};

template <class Visit, class Ahead>
void visit_affixes(const AffixOrder& order, const std::vector<AffixOrder::Item>& items, Visit&& visit,
                   Ahead&& ahead) {
    cancel::Poll& poll = cancel::current();
    std::vector<Affix> stack;
    for (size_t j = 0; j < items.size(); ++j) {
        const AffixOrder::Item& it = items[j];
        poll.tick(it.len);
        if (j + 8 < items.size()) ahead(items[j + 8].rank, items[j + 4].rank);
        const size_t lcp = j > 0 ? order.common_prefix(items[j - 1], it) : 0;
        while (!stack.empty() && stack.back().len > lcp) stack.pop_back();
        visit(it.rank, it.len, stack);
        stack.push_back(Affix{it.len, it.rank});
    }
}

}  // namespace

EncoderCore::EncoderCore(const std::vector<std::string>& tokens, const std::vector<uint32_t>& ranks,
                         int pattern, bool start_chars, uint32_t unknown)
    : pattern_(pattern), start_chars_(start_chars), unknown_(unknown), vocab_(tokens.size() + 16) {
    if (!start_chars && unknown != kNone) throw std::invalid_argument("an unknown id needs start_chars");
    if (tokens.size() != ranks.size())
        throw std::invalid_argument("tokens and ranks must have the same length");
    cancel::Poll& poll = cancel::current();
    uint32_t max_rank = 0;
    size_t total = 0;
    for (size_t k = 0; k < tokens.size(); ++k) {
        if (ranks[k] >= kMaxVocabSize)
            throw std::invalid_argument("rank " + std::to_string(ranks[k]) + " is too large: ids must be below " +
                                        std::to_string(kMaxVocabSize));
        if (tokens[k].size() > kMaxTokenBytes)
            throw std::invalid_argument("a token of " + std::to_string(tokens[k].size()) +
                                        " bytes is too long: at most " + std::to_string(kMaxTokenBytes));
        max_rank = std::max(max_rank, ranks[k]);
        total += tokens[k].size();
    }
    vocab_size_ = tokens.empty() ? 0 : static_cast<size_t>(max_rank) + 1;
    token_count_ = tokens.size();
    tok_off_.assign(vocab_size_, 0);
    tok_len_.assign(vocab_size_, kNone);
    tok_bytes_.reserve(total);

    for (size_t k = 0; k < tokens.size(); ++k) {
        const std::string& t = tokens[k];
        const uint32_t r = ranks[k];
        poll.tick(t.size());
        if (t.empty()) throw std::invalid_argument("empty token in the vocabulary");
        if (tok_len_[r] != kNone)
            throw std::invalid_argument("rank " + std::to_string(r) + " is given to two tokens");
        tok_off_[r] = tok_bytes_.size();
        tok_len_[r] = static_cast<uint32_t>(t.size());
        tok_bytes_ += t;
        max_token_len_ = std::max(max_token_len_, t.size());
    }

    // The tables of tokens (a third of the build) are filled on a thread of their own while
    // this one finds the pairs below, which need only the token bytes.
    bool duplicate = false;
    auto fill_token_tables = [&] {
        for (size_t k = 0; k < tokens.size() && !duplicate; ++k) {
            bool inserted = false;
            vocab_.get_or_insert(reinterpret_cast<const uint8_t*>(tokens[k].data()), tokens[k].size(), ranks[k],
                                 &inserted);
            duplicate = !inserted;
        }
        token_filter_.reset(tokens.size());
        size_t n_short = 0;
        for (const std::string& t : tokens) n_short += t.size() <= ShortKeyMap::kMaxKey;
        short_tokens_.reset(n_short);
        for (size_t k = 0; k < tokens.size(); ++k) {
            const Key key(reinterpret_cast<const uint8_t*>(tokens[k].data()), tokens[k].size());
            token_filter_.add(key.hash);
            if (key.n <= ShortKeyMap::kMaxKey) short_tokens_.insert(key, ranks[k]);
        }
    };
    SideThread token_tables(tokens.size() >= kParallelBuildTokens, fill_token_tables);
    if (!token_tables.started()) fill_token_tables();

    // (left, right) -> merged for every token and cut where both halves are tokens: the cut
    // at d pairs a prefix token of length d with a suffix token of length n - d. The
    // prefixes are stored, then met by the suffixes.
    struct Prefixes {
        uint64_t first;  // into pre
        uint64_t count;
    };
    std::vector<Prefixes> prefixes(vocab_size_);  // by rank
    std::vector<Affix> pre;
    pre.reserve(tokens.size() * 4);
    // The tokens sorted from their ends on a thread of their own while this one sorts them from
    // their starts and walks them: the two walks were half the build, on this thread alone.
    const AffixOrder forward{tok_bytes_.data(), tok_off_, false}, backward{tok_bytes_.data(), tok_off_, true};
    std::vector<AffixOrder::Item> by_ends;
    SideThread sort_ends(token_tables.started(), [&] { by_ends = backward.sorted(tokens, ranks); });
    visit_affixes(
        forward, forward.sorted(tokens, ranks),
        [&](uint32_t r, uint32_t, const std::vector<Affix>& stack) {
            prefixes[r] = Prefixes{pre.size(), stack.size()};
            pre.insert(pre.end(), stack.begin(), stack.end());
        },
        [](uint32_t, uint32_t) {});
    std::vector<std::pair<uint64_t, uint32_t>> found;  // (left << 32 | right, merged)
    found.reserve(tokens.size() * 2);
    if (sort_ends.started()) {
        sort_ends.join();
    } else {
        by_ends = backward.sorted(tokens, ranks);
    }
    visit_affixes(
        backward, by_ends,
        [&](uint32_t r, uint32_t n, const std::vector<Affix>& suf) {
            const Prefixes& pr = prefixes[r];
            size_t s = suf.size();  // walks down from the longest suffix
            for (size_t p = pr.first; p < pr.first + pr.count && s > 0; ++p) {
                const size_t want = n - pre[p].len;
                while (s > 0 && suf[s - 1].len > want) --s;
                if (s > 0 && suf[s - 1].len == want)
                    found.emplace_back((static_cast<uint64_t>(pre[p].rank) << 32) | suf[s - 1].rank, r);
            }
        },
        [&](uint32_t r8, uint32_t r4) {  // prefixes[r] is read first, then the list it points to
            __builtin_prefetch(&prefixes[r8]);
            __builtin_prefetch(pre.data() + prefixes[r4].first);
        });
    // Inserted apart from the walk, so that each slot can be fetched a few keys ahead.
    size_t n_pairs_guess = 0;  // the map's size decides its load factor, hence encoding speed: keep it sparse
    for (const auto& t : tokens) n_pairs_guess += t.size() > 1 ? 2 : 0;
    pairs_.reset(std::max(found.size(), n_pairs_guess), vocab_size_);
    for (size_t i = 0; i < found.size(); ++i) {
        if (i + 8 < found.size()) pairs_.prefetch(found[i + 8].first);
        pairs_.insert(found[i].first, found[i].second);
    }
    pair_filter_.reset(pairs_.size());
    pairs_.for_each([&](uint64_t key, uint32_t) { pair_filter_.add(hash_u64(key)); });

    token_tables.join();
    if (duplicate) throw std::invalid_argument("duplicate token bytes in the vocabulary");
    for (int b = 0; b < 256; ++b) {
        const uint8_t byte = static_cast<uint8_t>(b);
        const uint32_t* r = vocab_.find(&byte, 1);
        if (!r && unknown_ == kNone)
            throw std::invalid_argument("single byte " + std::to_string(b) + " is not in the vocabulary");
        byte_rank_[b] = r ? *r : kNone;
    }
    byte_pairs_.assign(65536, kNone);
    for (int a = 0; a < 256; ++a)
        for (int b = 0; b < 256; ++b) {
            if (byte_rank_[a] == kNone || byte_rank_[b] == kNone) continue;
            byte_pairs_[(a << 8) | b] = merged(byte_rank_[a], byte_rank_[b]);
        }
}

void EncoderCore::bpe(const uint8_t* p, size_t n, std::vector<uint32_t>& out, bool periodic, PieceCache* memo) const {
    if (n == 0) return;
    if (n >= kNone) throw std::length_error("a piece of 4 GiB or more");  // node indices are 32-bit
    if (start_chars_) {
        bpe_chars(p, n, out);
        return;
    }
    if (n == 1) {
        out.push_back(byte_rank_[p[0]]);
        return;
    }
    if (periodic && n >= kPeriodicPiece && bpe_periodic(p, n, out)) return;
    bpe_from(
        n, [&](size_t k) { return byte_rank_[p[k]]; }, [&](size_t k) { return merged_bytes(p[k], p[k + 1]); }, out,
        memo);
}

bool EncoderCore::compatible(uint32_t a, uint32_t b) const {
    const size_t la = tok_len_[a], lb = tok_len_[b];
    if (la + lb >= kPeriodicPiece) return false;
    uint8_t buf[kPeriodicPiece];
    std::memcpy(buf, tok_bytes_.data() + tok_off_[a], la);
    std::memcpy(buf + la, tok_bytes_.data() + tok_off_[b], lb);
    thread_local std::vector<uint32_t> ids;
    ids.clear();
    bpe(buf, la + lb, ids);
    return ids.size() == 2 && ids[0] == a && ids[1] == b;
}

// Exact by bpe-openai's corollaries on valid encodings (a sequence of tokens is valid when pure
// BPE of its bytes gives it back; BPE's output is the one valid sequence for its text):
//   - a contiguous part of a valid sequence is valid;
//   - valid x..y and valid y..z (sharing the token y) join into a valid x..y..z.
// The window's BPE W is valid, so is its part H (before b1) + S (b1 .. b1 + P, P a multiple of
// the text's period: S's bytes repeat). If (last S, first S) is compatible, H S S ... S is valid
// (join H S + first S with S, repeatedly), and with T = BPE of the rest, (last S, first T)
// compatible, H S..S T is valid: it is the BPE of the whole piece. Any check that fails falls
// back to the general merge, so the shortcut only decides speed.
bool EncoderCore::bpe_periodic(const uint8_t* p, size_t n, std::vector<uint32_t>& out) const {
    // The smallest period of the first bytes, then checked over the whole piece (memcmp of
    // the piece against itself shifted by d: equal iff p[i] == p[i + d] everywhere).
    constexpr size_t kProbe = 512;
    size_t d = 0;
    for (size_t c = 1; c <= kMaxPeriod; ++c) {
        if (std::memcmp(p, p + c, kProbe - c) == 0) {
            d = c;
            break;
        }
    }
    if (d == 0 || std::memcmp(p, p + d, n - d) != 0) return false;

    const size_t window = std::min(n, 1024 + 16 * d);
    thread_local std::vector<uint32_t> head, tail;
    head.clear();
    bpe_from(
        window, [&](size_t k) { return byte_rank_[p[k]]; }, [&](size_t k) { return merged_bytes(p[k], p[k + 1]); },
        head);
    // S: the tokens from the first boundary past a quarter of the window to the next boundary
    // a multiple of d further, before three quarters (away from the window's edges).
    size_t i1 = 0, b1 = 0, at = 0;
    while (i1 < head.size() && at < window / 4) at += tok_len_[head[i1++]];
    b1 = at;
    size_t i2 = i1, period = 0;
    while (i2 < head.size() && at < 3 * window / 4) {
        at += tok_len_[head[i2++]];
        if ((at - b1) % d == 0) {
            period = at - b1;
            break;
        }
    }
    if (period == 0 || b1 + period > window) return false;
    const uint32_t s_first = head[i1], s_last = head[i2 - 1];
    if (!compatible(s_last, s_first)) return false;

    // The rest: 256 bytes or more, so that its right end's merges settle inside it.
    constexpr size_t kTail = 256;
    if (n < b1 + kTail + period) return false;
    const size_t max_q = (n - b1 - kTail) / period;
    for (size_t tries = 0; tries < 4 && tries < max_q; ++tries) {
        const size_t q = max_q - tries;
        const size_t t = b1 + q * period;
        if (n - t >= kPeriodicPiece) break;
        tail.clear();
        bpe(p + t, n - t, tail);
        if (!compatible(s_last, tail[0])) continue;
        const size_t s_len = i2 - i1;
        out.reserve(out.size() + i1 + q * s_len + tail.size());
        out.insert(out.end(), head.begin(), head.begin() + static_cast<std::ptrdiff_t>(i1));
        if (s_len == 1) {
            out.insert(out.end(), q, s_first);
        } else {
            for (size_t r = 0; r < q; ++r)
                out.insert(out.end(), head.begin() + static_cast<std::ptrdiff_t>(i1),
                           head.begin() + static_cast<std::ptrdiff_t>(i2));
        }
        out.insert(out.end(), tail.begin(), tail.end());
        return true;
    }
    return false;
}

void EncoderCore::bpe_chars(const uint8_t* p, size_t n, std::vector<uint32_t>& out) const {
    thread_local std::vector<uint32_t> ids;
    ids.clear();
    for (size_t i = 0; i < n;) {
        const Char c = char_at(p, n, i);
        const uint32_t* r = c.len == 1 ? (byte_rank_[p[i]] != kNone ? &byte_rank_[p[i]] : nullptr) : vocab_.find(p + i, c.len);
        if (r != nullptr) {
            ids.push_back(*r);
        } else if (unknown_ != kNone) {
            ids.push_back(unknown_);
        } else {
            for (size_t j = i; j < i + c.len; ++j) ids.push_back(byte_rank_[p[j]]);  // byte fallback
        }
        i += c.len;
    }
    const uint32_t* t = ids.data();
    if (ids.size() == 1) {
        out.push_back(t[0]);
        return;
    }
    bpe_from(ids.size(), [t](size_t k) { return t[k]; }, [this, t](size_t k) { return merged(t[k], t[k + 1]); }, out);
}

template <class First, class Pair>
void EncoderCore::bpe_small(size_t n, First first, Pair pair, std::vector<uint32_t>& out, PieceCache* memo) const {
    uint32_t tok[kSmallPiece + small_merge::kPad];
    uint32_t rk[kSmallPiece + small_merge::kPad];  // rk[k]: rank of merging tok[k] with tok[k + 1], kNone if none
    if (n < 2) {  // callers send longer pieces; the padding below starts at rk[n - 1]
        if (n == 1) out.push_back(first(0));
        return;
    }
    size_t m = n;
    for (size_t k = 0; k < n; ++k) tok[k] = first(k);
    for (size_t k = 0; k + 1 < m; ++k) rk[k] = pair(k);
    // the shift reads (never uses) entries past the live ones: set, so that nothing reads garbage
    std::memset(tok + n, 0, small_merge::kPad * sizeof(uint32_t));
    std::memset(rk + n - 1, 0, small_merge::kPad * sizeof(uint32_t));
    while (m > 1) {
        uint32_t best;
        const size_t at = small_merge::lowest_pair(rk, m - 1, best);
        if (best == kNone) break;
        tok[at] = best;
        // drop token at + 1 and pair at + 1
        small_merge::shift_down(tok, at + 1, m - 1);
        small_merge::shift_down(rk, at + 1, m - 1);
        --m;
        if (at + 1 < m) rk[at] = merged(tok[at], tok[at + 1], memo);
        if (at > 0) rk[at - 1] = merged(tok[at - 1], tok[at], memo);
    }
    append_ids(out, tok, tok + m);
}

namespace {

// A byte position of a piece being merged. Nodes are the original byte positions; a merged
// node keeps its left position, so list order is position order and (rank, position)
// orders candidates "lowest rank, then leftmost". rk is the rank of merging the node with
// its right neighbour (kNone if none, or if the node was merged away): a queued candidate
// (rank, k) is live iff nodes[k].rk == rank.
struct Node {
    uint32_t tok, nxt, prv, rk;
};

// Per-thread scratch nodes, reused by the pieces a thread encodes.
std::vector<Node>& scratch_nodes() {
    thread_local std::vector<Node> nodes;
    return nodes;
}

// One (rank << 32 | position) binary min-heap.
class HeapQueue {
public:
    // `storage` is scratch space reused across calls (cleared here).
    HeapQueue(std::vector<uint64_t>& storage, size_t n) : heap_(storage) {
        heap_.clear();
        heap_.reserve(n);
    }
    void push(uint32_t r, uint32_t k) {
        heap_.push_back((static_cast<uint64_t>(r) << 32) | k);
        if (heapified_) std::push_heap(heap_.begin(), heap_.end(), std::greater<uint64_t>());
    }
    void start(const Node*) {
        std::make_heap(heap_.begin(), heap_.end(), std::greater<uint64_t>());
        heapified_ = true;
    }
    bool pop(uint32_t& r, uint32_t& k) {
        if (heap_.empty()) return false;
        const uint64_t top = heap_.front();
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<uint64_t>());
        heap_.pop_back();
        r = static_cast<uint32_t>(top >> 32);
        k = static_cast<uint32_t>(top);
        return true;
    }

private:
    std::vector<uint64_t>& heap_;
    bool heapified_ = false;
};

// Candidates of one rank: positions, popped smallest first. Positions mostly arrive in
// increasing order (a pass over a lower rank's candidates runs left to right), so they go
// to a sorted run that pops in O(1); the rest go to a min-heap.
struct RankBucket {
    std::vector<uint32_t> run;
    size_t head = 0;
    std::vector<uint32_t> heap;  // min-heap (std::greater)
    bool queued = false;         // rank is in the queue of ranks

    bool empty() const { return head == run.size() && heap.empty(); }
    void push(uint32_t pos) {
        if (head == run.size()) {
            run.clear();
            head = 0;
            run.push_back(pos);
        } else if (pos > run.back()) {
            run.push_back(pos);
        } else {
            heap.push_back(pos);
            std::push_heap(heap.begin(), heap.end(), std::greater<uint32_t>());
        }
    }
    template <class T>
    uint32_t pop(const T* prefetch_base) {
        if (head < run.size() && (heap.empty() || run[head] < heap.front())) {
            // candidates are popped in position order: fetch the node a few pops ahead
            if (head + 16 < run.size()) __builtin_prefetch(prefetch_base + run[head + 16]);
            return run[head++];
        }
        std::pop_heap(heap.begin(), heap.end(), std::greater<uint32_t>());
        const uint32_t v = heap.back();
        heap.pop_back();
        return v;
    }
};

// A bucket per rank plus a min-heap of the ranks whose bucket may be non-empty: popping
// the smallest rank's smallest position is the (rank, position) order of HeapQueue, with
// O(1) work for most candidates.
class BucketQueue {
public:
    explicit BucketQueue(size_t vocab_size) : bucket_of_(vocab_size, EncoderCore::kNone) {}
    void push(uint32_t r, uint32_t k) {
        uint32_t& b = bucket_of_[r];
        if (b == EncoderCore::kNone) {
            b = static_cast<uint32_t>(buckets_.size());
            buckets_.emplace_back();
        }
        RankBucket& bk = buckets_[b];
        bk.push(k);
        if (!bk.queued) {
            bk.queued = true;
            ranks_.push_back(r);
            std::push_heap(ranks_.begin(), ranks_.end(), std::greater<uint32_t>());
        }
    }
    void start(const Node* nodes) { nodes_ = nodes; }
    bool pop(uint32_t& r, uint32_t& k) {
        while (!ranks_.empty()) {
            r = ranks_.front();
            RankBucket& bk = buckets_[bucket_of_[r]];
            if (!bk.empty()) {
                k = bk.pop(nodes_);
                return true;
            }
            bk.queued = false;
            std::pop_heap(ranks_.begin(), ranks_.end(), std::greater<uint32_t>());
            ranks_.pop_back();
        }
        return false;
    }

private:
    const Node* nodes_ = nullptr;
    std::vector<uint32_t> bucket_of_;
    std::vector<RankBucket> buckets_;
    std::vector<uint32_t> ranks_;
};

}  // namespace

template <class Queue, class First, class Pair>
void EncoderCore::bpe_linked(size_t n, First first, Pair pair, Queue& queue, std::vector<uint32_t>& out,
                             PieceCache* memo) const {
    const uint32_t end = static_cast<uint32_t>(n);
    std::vector<Node>& nodes = scratch_nodes();
    struct Trim {  // do not keep huge scratch, also when cancelled
        std::vector<Node>& v;
        ~Trim() {
            if (v.capacity() > kHugePiece) std::vector<Node>().swap(v);
        }
    } trim{nodes};
    cancel::Poll& poll = cancel::current();
    nodes.resize(n);
    // Through a plain pointer: the compiler re-derives a thread_local's address (a call to
    // __tls_get_addr in a shared library) at uses of `nodes` inside the loop.
    Node* const nd = nodes.data();
    for (size_t k = 0; k < n; ++k) {
        nd[k].tok = first(k);
        nd[k].nxt = static_cast<uint32_t>(k + 1);
        nd[k].prv = k == 0 ? kNone : static_cast<uint32_t>(k - 1);
    }
    for (size_t k = 0; k < n; ++k) {
        const uint32_t r = k + 1 < n ? pair(k) : kNone;
        nd[k].rk = r;
        if (r != kNone) queue.push(r, static_cast<uint32_t>(k));
    }
    queue.start(nd);
    uint32_t r, k;
    uint32_t pops = 0;  // counted in a register, handed to the poll every 4096
    while (queue.pop(r, k)) {
        if (++pops == 4096) {
            poll.tick(pops);
            pops = 0;
        }
        Node& a = nd[k];
        if (a.rk != r) continue;  // stale candidate
        Node& b = nd[a.nxt];
        a.tok = r;
        b.rk = kNone;
        a.nxt = b.nxt;
        if (a.nxt != end) {
            Node& c = nd[a.nxt];
            c.prv = k;
            a.rk = merged(r, c.tok, memo);
            if (a.rk != kNone) queue.push(a.rk, k);
        } else {
            a.rk = kNone;
        }
        if (a.prv != kNone) {
            Node& z = nd[a.prv];
            z.rk = merged(z.tok, r, memo);
            if (z.rk != kNone) queue.push(z.rk, a.prv);
        }
    }
    for (uint32_t i = 0; i != end; i = nd[i].nxt) out.push_back(nd[i].tok);
}

// Pieces up to kSmallPiece tokens: the array merge; up to kHugePiece a binary heap; longer a
// bucket queue by rank.
template <class First, class Pair>
void EncoderCore::bpe_from(size_t n, First first, Pair pair, std::vector<uint32_t>& out, PieceCache* memo) const {
    if (n <= kSmallPiece) {
        bpe_small(n, first, pair, out, memo);
    } else if (n <= kHugePiece) {
        thread_local std::vector<uint64_t> heap_storage;
        HeapQueue queue(heap_storage, n);
        bpe_linked(n, first, pair, queue, out, memo);
    } else {
        BucketQueue queue(vocab_size_);
        bpe_linked(n, first, pair, queue, out, memo);
    }
}

void EncoderCore::encode_piece(const uint8_t* piece, size_t n, std::vector<uint32_t>& out, bool periodic) const {
    if (n == 0) return;
    if (const uint32_t* r = token_of(Key(piece, n))) {
        out.push_back(*r);
        return;
    }
    bpe(piece, n, out, periodic);
}

// A piece of the words table (of <= 15 bytes) that its set `w` did not hold: a token (most of
// them), a word of the word store, or a new word, BPE'd and kept in the store; then kept in the
// set too, the word met last first. The recent-piece tables and the cache's map are skipped: each
// table looked at is one more line to fetch for a word met the first time. Out of line: the loop
// over the pieces keeps its registers.
void EncoderCore::word_miss(const uint8_t* p, size_t len, uint64_t head, uint64_t tail, PieceCache::Word* w,
                            std::vector<uint32_t>& out, PieceCache* cache) const {
    PieceCache::Word word{head, tail, static_cast<uint16_t>(len), 1, {0, 0, 0}};
    const uint32_t* token = len == 1 ? &byte_rank_[*p] : token_of(Key(p, len));  // byte-level: every byte is a token
    if (token != nullptr) {
        word.ids[0] = *token;
        out.push_back(*token);
    } else if (const PieceCache::Word* known = cache->word_store.find(head, tail, len)) {
        word = *known;
        const uint32_t* ids = cache->ids_of(word);
        append_ids(out, ids, ids + word.count);
    } else {
        const size_t before = out.size();
        bpe(p, len, out, true, cache);
        const size_t count = out.size() - before;
        if (cache->word_store.size() >= PieceCache::kMaxEntries || cache->ids.size() + count > PieceCache::kMaxIds)
            cache->clear();
        word.count = static_cast<uint16_t>(count);
        if (count > PieceCache::kWordIds) {
            word.ids[0] = static_cast<uint32_t>(cache->ids.size());
            append_ids(cache->ids, out.data() + before, out.data() + out.size());
        } else {
            for (size_t k = 0; k < count; ++k) word.ids[k] = out[before + k];
        }
        cache->word_store.insert(word);
    }
    w[1] = w[0];  // the set's older word moves to its second way
    w[0] = word;
}

void EncoderCore::encode(const uint8_t* data, size_t n, std::vector<uint32_t>& out, PieceCache* cache) const {
    // Inlined into the slow path below: most pieces it gets are one token, found by one lookup.
    auto piece = [&](const Key& key) __attribute__((always_inline)) {
        const uint8_t* p = key.p;
        const size_t len = key.n;
        if (len == 1 && byte_rank_[*p] != kNone) {
            out.push_back(byte_rank_[*p]);
            return;
        }
        PieceCache::Recent* recent = nullptr;
        if (cache != nullptr && len <= 8) {
            recent = &cache->recent()[key.hash & (PieceCache::kRecent - 1)];
            if (recent->len == len && recent->head == key.head) {
                if (recent->id != kNone) {
                    out.push_back(recent->id);
                } else {
                    encode_merged(key, out, cache);  // known not to be a token
                }
                return;
            }
        } else if (cache != nullptr && len <= PieceCache::kMaxPieceBytes) {
            if (len <= 16) {
                const PieceCache::RecentLong& hit = cache->recent_long()[key.hash & (PieceCache::kRecentLong - 1)];
                if (hit.len == len && hit.head == key.head && hit.tail == detail::read64(p + len - 8) &&
                    hit.count != 0) {
                    for (size_t k = 0; k < hit.count; ++k) out.push_back(hit.ids[k]);
                    return;
                }
            }
            encode_long(key, out, cache);
            return;
        }
        const uint32_t* r = token_of(key);
        if (recent != nullptr) *recent = PieceCache::Recent{key.head, static_cast<uint32_t>(len), r ? *r : kNone};
        if (r != nullptr) {
            out.push_back(*r);
            return;
        }
        encode_merged(key, out, cache);
    };
    cancel::Poll& poll = cancel::current();
    PieceCache::Word* const words = cache != nullptr && !start_chars_ ? cache->words() : nullptr;
    // The scanner finds kChunk pieces, then they are looked up in order: the scanner's loop keeps
    // its registers, and each piece's set in the words table, prefetched when the piece was
    // found, has had the rest of the chunk's scanning to arrive (the tables, 2 MiB, are out of the
    // cache when a call starts after other work). Against a lookup 16 pieces after each find, in
    // one loop: unseen text 2-9% faster (docs/performance.md, nineteenth pass).
    // A piece of the words table is keyed by its bytes as loaded, those past the piece masked
    // off; any other piece points at kNoWord, a set whose length 0 no piece has: the lookup's
    // first compare sends it on without a branch of its own.
    static constexpr PieceCache::Word kNoWord[2]{};
    struct Found {
        size_t b, len;
        uint64_t head, tail;           // other pieces: their Key's head and hash
        const PieceCache::Word* word;  // its set in the words table, or kNoWord
    };
    constexpr size_t kChunk = 64;
    Found found[kChunk];
    size_t count = 0;
    size_t next_poll = pretok::kPollBytes;
    // A piece the words table did not hold (word_miss), or any other piece. Out of line, as is
    // the loop over a chunk: the scanner's loop keeps its registers.
    auto look_up = [&](const Found& f) __attribute__((noinline)) {
        if (f.word == kNoWord) {
            piece(Key(data + f.b, f.len, f.head, f.tail));
        } else {  // the table's own set (Found holds it as const for kNoWord's sake)
            word_miss(data + f.b, f.len, f.head, f.tail, const_cast<PieceCache::Word*>(f.word), out, cache);
        }
    };
    // Whether the words-table entry x is the piece f's.
    auto holds = [](const Found& f, const PieceCache::Word& x) {
        return x.len == f.len && x.head == f.head && x.tail == f.tail;
    };
    // The first `pieces` of `found`; the poll hears of their bytes once a chunk.
    auto look_up_chunk = [&](size_t pieces) __attribute__((noinline)) {
        // First, for the words neither way of their set holds, the lines word_miss reads (the token
        // filter's word, the token table's slot, the word store's slot) fetched together: read
        // one word after another, each waited for memory (multilingual text 7-16% faster).
        for (size_t i = 0; i < pieces; ++i) {
            const Found& f = found[i];
            const PieceCache::Word* w = f.word;
            if (w == kNoWord || f.len == 1 || holds(f, w[0]) || holds(f, w[1])) continue;
            prefetch_token(Key(data + f.b, f.len));
            cache->word_store.prefetch(f.head, f.tail, f.len);
        }
        for (size_t i = 0; i < pieces; ++i) {
            const Found& f = found[i];
            PieceCache::Word* const w = const_cast<PieceCache::Word*>(f.word);
            if (!holds(f, w[0])) {
                if (f.word == kNoWord || !holds(f, w[1])) {
                    look_up(f);
                    continue;
                }
                std::swap(w[0], w[1]);  // the word met last first
            }
            if (w->count <= PieceCache::kWordIds) {
                out.push_back(w->ids[0]);
                for (size_t k = 1; k < w->count; ++k) out.push_back(w->ids[k]);
            } else {
                const uint32_t* ids = cache->ids.data() + w->ids[0];
                append_ids(out, ids, ids + w->count);
            }
        }
        const size_t end = found[pieces - 1].b + found[pieces - 1].len;
        if (end >= next_poll) {
            poll.tick(end + pretok::kPollBytes - next_poll);
            next_poll = end + pretok::kPollBytes;
        }
    };
    pretok::split_with(data, n, pattern_, [&](size_t b, size_t e, auto ascii) __attribute__((always_inline)) {
        Found& f = found[count];
        const size_t len = e - b;
        // A piece of the ASCII scanners, or one of 2..15 bytes of another script (most words of
        // 2-7 letters) or of a general function, keyed the same way: its bytes as loaded, 8 of
        // them readable at its start.
        bool in_words;
        if constexpr (decltype(ascii)::value) {
            in_words = words != nullptr;
        } else {
            in_words = words != nullptr && len - 2 <= 13 && b + 8 <= n;
        }
        if (in_words) {
            const pretok::WordKey k = pretok::word_key(data + b, len);
            PieceCache::Word* w = &words[2 * pretok::word_key_slot(k.head, k.tail, PieceCache::kWordBits - 1)];
            __builtin_prefetch(w);
            f = Found{b, len, k.head, k.tail, w};
        } else {
            const Key key(data + b, len);
            if (cache != nullptr) {
                if (len <= 8) {
                    __builtin_prefetch(&cache->recent()[key.hash & (PieceCache::kRecent - 1)]);
                } else if (len <= 16) {
                    __builtin_prefetch(&cache->recent_long()[key.hash & (PieceCache::kRecentLong - 1)]);
                }
            }
            f = Found{b, len, key.head, key.hash, kNoWord};
        }
        if (++count == kChunk) {
            look_up_chunk(count);
            count = 0;
        }
    });
    if (count != 0) look_up_chunk(count);
    poll.tick(n + pretok::kPollBytes - next_poll);
}

// A piece that is not a single token: its ids from the cache, or BPE (then cached).
void EncoderCore::encode_merged(const Key& key, std::vector<uint32_t>& out, PieceCache* cache) const {
    if (cache == nullptr || key.n > PieceCache::kMaxPieceBytes) {
        bpe(key.p, key.n, out, true, cache);
        return;
    }
    size_t at;
    if (const PieceCache::Span* s = cache->map.find(key, at)) {
        append_ids(out, cache->ids.data() + s->off, cache->ids.data() + s->off + s->len);
        return;
    }
    const size_t before = out.size();
    bpe(key.p, key.n, out, true, cache);
    cache_ids(key, at, out, before, cache);
}

// Keeps the ids out[before..] of the piece `key` in the cache's map.
void EncoderCore::cache_ids(const Key& key, size_t slot, const std::vector<uint32_t>& out, size_t before,
                            PieceCache* cache) const {
    if (cache->map.size() >= PieceCache::kMaxEntries || cache->ids.size() >= PieceCache::kMaxIds) {
        cache->clear();
        cache->map.find(key, slot);  // the slot in the emptied table
    }
    const PieceCache::Span span{static_cast<uint32_t>(cache->ids.size()), static_cast<uint32_t>(out.size() - before)};
    cache->map.insert_new(slot, key, span);
    append_ids(cache->ids, out.data() + before, out.data() + out.size());
}

// A piece of 9..kMaxPieceBytes bytes that missed recent_long. Its ids, looked up in the cache's
// map first (which for these lengths holds the pieces that are one token too: most pieces this
// long are not, and the map is much smaller than the vocabulary's tables), then noted in
// recent_long for pieces of up to 16 bytes.
void EncoderCore::encode_long(const Key& key, std::vector<uint32_t>& out, PieceCache* cache) const {
    const size_t before = out.size();
    size_t at;
    if (const PieceCache::Span* s = cache->map.find(key, at)) {
        append_ids(out, cache->ids.data() + s->off, cache->ids.data() + s->off + s->len);
    } else {
        if (const uint32_t* r = token_of(key)) {
            out.push_back(*r);
        } else {
            bpe(key.p, key.n, out, true, cache);
        }
        cache_ids(key, at, out, before, cache);
    }
    if (key.n > 16) return;
    PieceCache::RecentLong& slot = cache->recent_long()[key.hash & (PieceCache::kRecentLong - 1)];
    const size_t count = out.size() - before;
    slot.head = key.head;
    slot.tail = detail::read64(key.p + key.n - 8);
    slot.len = static_cast<uint16_t>(key.n);
    slot.count = static_cast<uint16_t>(count <= PieceCache::kLongIds ? count : 0);
    for (size_t k = 0; k < slot.count; ++k) slot.ids[k] = out[before + k];
}

void EncoderCore::encode_batch(const std::vector<const uint8_t*>& docs, const std::vector<size_t>& lens,
                               int num_threads, BatchIds& ids, std::vector<uint64_t>& offsets,
                               const std::vector<uint8_t>* kinds) {
    const size_t nd = docs.size();
    offsets.assign(nd + 1, 0);
    ids.clear();
    if (nd == 0) return;

    auto kind_of = [&](size_t d) -> unsigned { return kinds != nullptr ? (*kinds)[d] : 0; };
    // The bytes a document counts for in planning: a str's UTF-8 is not known before it is made.
    auto bytes_of = [&](size_t d) { return kind_of(d) == 0 ? lens[d] : lens[d] * utf8_bytes_per_unit(kind_of(d)); };
    // Appends document d's ids, its UTF-8 made first in this thread's buffer when it is a str's units.
    auto encode_doc = [&](size_t d, std::vector<uint32_t>& out, PieceCache* cache) {
        const unsigned kind = kind_of(d);
        if (kind == 0) {
            encode(docs[d], lens[d], out, cache);
            return;
        }
        thread_local std::unique_ptr<uint8_t[]> utf8;
        thread_local size_t capacity = 0;
        const size_t need = lens[d] * utf8_bytes_per_unit(kind);
        if (need > capacity) {
            utf8.reset(new uint8_t[need]);
            capacity = need;
        }
        struct Trim {  // a thread keeps no more than kKeptUtf8 bytes of buffer, also when cancelled
            ~Trim() {
                if (capacity > kKeptUtf8) {
                    utf8.reset();
                    capacity = 0;
                }
            }
        } trim;
        const size_t n = utf8_from_units(docs[d], lens[d], kind, utf8.get());
        if (n == SIZE_MAX) throw SurrogateInText();
        encode(utf8.get(), n, out, cache);
    };

    size_t nt = threads_for(num_threads);
    // Chunks of consecutive documents, handed out dynamically: of 256 KiB, or smaller for a small
    // batch, so that each thread has several to take (with one chunk or two per thread, a batch
    // of 0.3 MB on two threads ran no faster than on one).
    size_t total_bytes = 0;
    for (size_t d = 0; d < nd; ++d) total_bytes += bytes_of(d);
    const size_t chunk_bytes = EncoderCore::chunk_bytes(total_bytes, nd, nt);
    // A document of many chunks would keep one thread busy while the others wait (one document of
    // 6 MB in 20 MB of English held 16 threads to 3x one): it is cut at safe points into pieces of
    // about a chunk, encoded as documents of their own, and put back together.
    if (nt > 1) {
        std::vector<const uint8_t*> piece_ptr;
        std::vector<size_t> piece_len, pieces_of(nd);
        std::vector<uint8_t> piece_kinds;
        for (size_t d = 0; d < nd; ++d) {
            const unsigned kind = kind_of(d);
            pieces_of[d] = kind == 0 ? cut_pieces(docs[d], lens[d], chunk_bytes, piece_ptr, piece_len)
                                     : cut_units(docs[d], kind, lens[d], chunk_bytes / utf8_bytes_per_unit(kind),
                                                 piece_ptr, piece_len);
            if (kinds != nullptr) piece_kinds.resize(piece_ptr.size(), static_cast<uint8_t>(kind));
        }
        if (piece_ptr.size() > nd) {
            std::vector<uint64_t> piece_offsets;
            encode_batch(piece_ptr, piece_len, num_threads, ids, piece_offsets, kinds != nullptr ? &piece_kinds : nullptr);
            for (size_t d = 0, k = 0; d < nd; ++d) {
                k += pieces_of[d];
                offsets[d + 1] = piece_offsets[k];
            }
            return;
        }
    }
    // A document counts 16 bytes more than its length (its own cost, however short it is).
    std::vector<size_t> chunk_start{0}, chunk_size;  // chunk_size: the bytes of each chunk's documents
    size_t acc = 0;
    for (size_t d = 0; d < nd; ++d) {
        acc += bytes_of(d);
        if ((acc + 16 * (d + 1 - chunk_start.back()) >= chunk_bytes && d + 1 < nd) || d + 1 == nd) {
            chunk_start.push_back(d + 1);
            chunk_size.push_back(acc);
            acc = 0;
        }
    }
    const size_t nchunks = chunk_start.size() - 1;
    nt = std::min(nt, nchunks);
    if (nt <= 1) {
        // One thread: straight into `ids`, sized for ~4 bytes per id up front, up to 64 MiB
        // (growing it from empty copies every id a few times, and concatenating chunks once more).
        std::vector<uint32_t>& out = ids.vector();
        out.reserve(std::min(total_bytes / 4, size_t{1} << 24) + 16);
        std::unique_ptr<PieceCache> cache = acquire_cache();
        for (size_t d = 0; d < nd; ++d) {
            const size_t before = out.size();
            encode_doc(d, out, cache.get());
            offsets[d + 1] = offsets[d] + (out.size() - before);
        }
        release_cache(std::move(cache));
        return;
    }

    std::vector<std::vector<uint32_t>> chunk_ids(nchunks);
    std::vector<uint64_t> doc_count(nd, 0);
    // The chunks in nt runs of consecutive chunks, run t taken by thread t first, then, once it is
    // done, what is left of the others' runs. From call to call a thread then meets the same
    // documents again, which its caches (the same cache each call, below) hold the words of; taken
    // one by one in turn, a batch met before cost 2.9x the CPU per byte on 16 threads that it cost
    // on one (multilingual text, its pieces mostly rare).
    struct alignas(64) Run {
        std::atomic<size_t> next;
        size_t end;
    };
    std::unique_ptr<Run[]> runs(new Run[nt]);
    for (size_t t = 0; t < nt; ++t) {
        runs[t].next.store(t * nchunks / nt, std::memory_order_relaxed);
        runs[t].end = (t + 1) * nchunks / nt;
    }
    std::exception_ptr error;
    std::mutex error_mu;
    cancel::Scope* scope = cancel::current().scope();  // the caller's, shared with the helper threads

    // The threads' caches, taken here in a fixed order and given back in the reverse one: from call
    // to call the calling thread gets the same cache, and so does each helper, whose tables then
    // stay in the cache of the core it runs on (taken by the threads as they started, the caches
    // changed hands at random, and two threads used 1.4x the CPU time of one on text they had met).
    std::vector<std::unique_ptr<PieceCache>> caches(nt);
    for (auto& c : caches) c = acquire_cache();
    auto release_caches = [&]() {
        for (size_t t = nt; t-- > 0;) release_cache(std::move(caches[t]));
    };
    auto worker = [&](size_t thread) {
        const bool helper = thread != 0;
        PieceCache* const cache = caches[thread].get();
        try {
            std::optional<cancel::Bind> bind;
            if (helper && scope != nullptr) bind.emplace(scope, false);
            for (size_t k = 0; k < nt; ++k) {
                Run& run = runs[(thread + k) % nt];  // its own run first
                for (size_t c; (c = run.next.fetch_add(1)) < run.end;) {
                    // The ids go to a vector of this thread's own, moved into chunk_ids when the
                    // chunk is done: the vectors' headers in chunk_ids share cache lines, and a
                    // thread appending through one of them while another thread appended through
                    // its neighbour moved that line between the cores at every id (2 threads took
                    // 1.4x the CPU time of one on the same batch).
                    std::vector<uint32_t> out;
                    // A third of an id per byte is more than English or code takes: a chunk of one
                    // long document (a block of a file) then grows its vector once at most.
                    out.reserve(chunk_size[c] / 3 + 16);
                    for (size_t d = chunk_start[c]; d < chunk_start[c + 1]; ++d) {
                        const size_t before = out.size();
                        encode_doc(d, out, cache);
                        doc_count[d] = out.size() - before;
                    }
                    chunk_ids[c] = std::move(out);
                }
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mu);
            if (!error) error = std::current_exception();
            for (size_t t = 0; t < nt; ++t) runs[t].next.store(runs[t].end);
            if (scope != nullptr) scope->stop();  // the other threads stop within a poll
        }
    };

    HelperPool::get().run(nt - 1, worker);
    release_caches();
    if (error) std::rethrow_exception(error);

    // The chunks' ids copied to their places in one buffer, by the threads again, each its own run
    // first (the chunks it encoded, some still in its core's cache); each chunk freed once copied.
    // On the calling thread alone this copy, and the first writes to the new buffer's pages, were
    // a serial pass over the whole output at the end of every call.
    std::vector<size_t> chunk_at(nchunks + 1, 0);
    for (size_t c = 0; c < nchunks; ++c) chunk_at[c + 1] = chunk_at[c] + chunk_ids[c].size();
    uint32_t* const dst = ids.allocate(chunk_at[nchunks]);
    for (size_t t = 0; t < nt; ++t) runs[t].next.store(t * nchunks / nt, std::memory_order_relaxed);
    auto copier = [&](size_t thread) {
        for (size_t k = 0; k < nt; ++k) {
            Run& run = runs[(thread + k) % nt];
            for (size_t c; (c = run.next.fetch_add(1)) < run.end;) {
                std::vector<uint32_t>& v = chunk_ids[c];
                if (!v.empty()) std::memcpy(dst + chunk_at[c], v.data(), v.size() * sizeof(uint32_t));
                std::vector<uint32_t>().swap(v);
            }
        }
    };
    // A small output is copied faster than the helpers wake up.
    HelperPool::get().run(chunk_at[nchunks] >= kParallelCopyIds ? nt - 1 : 0, copier);
    for (size_t d = 0; d < nd; ++d) offsets[d + 1] = offsets[d] + doc_count[d];
}

namespace {

// EncoderCore::safe_cut over a text's units: UTF-8 bytes, or a Python str's code units (of 2 or 4
// bytes; its ASCII characters are units of the same values, so the same cuts).
template <class Unit>
size_t safe_cut_in(const Unit* data, size_t n, size_t from, int pattern) {
    if (pattern != kGpt2 && pattern != kCl100k && pattern != kO200k) return n;
    const auto printable = [](uint32_t c) { return c >= 0x21 && c <= 0x7e; };
    for (size_t at = from; at + 1 < n;) {
        size_t nl = at;  // a newline with a unit after it
        if constexpr (sizeof(Unit) == 1) {
            const void* found = std::memchr(data + at, '\n', n - 1 - at);
            if (found == nullptr) break;
            nl = static_cast<size_t>(static_cast<const Unit*>(found) - data);
        } else {
            while (nl + 1 < n && data[nl] != '\n') ++nl;
            if (nl + 1 == n) break;
        }
        const uint32_t next = data[nl + 1];
        const bool cut = pattern == kGpt2    ? printable(next) && nl >= 1 && printable(data[nl - 1])
                         : pattern == kO200k ? printable(next) && next != '/'
                                             : printable(next);
        if (cut) return nl + 1;
        at = nl + 1;
    }
    return n;
}

template <class Unit>
size_t cut_pieces_in(const Unit* data, size_t n, size_t target, int pattern, std::vector<const uint8_t*>& ptrs,
                     std::vector<size_t>& lens) {
    size_t start = 0, count = 0;
    do {
        const size_t end = n - start <= 2 * target ? n : safe_cut_in(data, n, start + target, pattern);
        ptrs.push_back(reinterpret_cast<const uint8_t*>(data + start));
        lens.push_back(end - start);
        ++count;
        start = end;
    } while (start < n);
    return count;
}

}  // namespace

size_t EncoderCore::safe_cut(const uint8_t* data, size_t n, size_t from) const {
    return safe_cut_in(data, n, from, pattern_);
}

size_t EncoderCore::cut_pieces(const uint8_t* data, size_t n, size_t target, std::vector<const uint8_t*>& ptrs,
                               std::vector<size_t>& lens) const {
    return cut_pieces_in(data, n, target, pattern_, ptrs, lens);
}

size_t EncoderCore::cut_units(const void* units, unsigned kind, size_t n, size_t target,
                              std::vector<const uint8_t*>& ptrs, std::vector<size_t>& lens) const {
    switch (kind) {
        case 1:
            return cut_pieces_in(static_cast<const uint8_t*>(units), n, target, pattern_, ptrs, lens);
        case 2:
            return cut_pieces_in(static_cast<const uint16_t*>(units), n, target, pattern_, ptrs, lens);
        default:
            return cut_pieces_in(static_cast<const uint32_t*>(units), n, target, pattern_, ptrs, lens);
    }
}

bool EncoderCore::decode(const uint32_t* ids, size_t m, std::string& out, size_t* bad_index) const {
    size_t total = 0;
    for (size_t k = 0; k < m; ++k) {
        const uint32_t id = ids[k];
        if (id >= vocab_size_ || tok_len_[id] == kNone) {
            *bad_index = k;
            return false;
        }
        total += tok_len_[id];
    }
    out.resize(total);
    char* dst = out.data();
    for (size_t k = 0; k < m; ++k) {
        const uint32_t len = tok_len_[ids[k]];
        std::memcpy(dst, tok_bytes_.data() + tok_off_[ids[k]], len);
        dst += len;
    }
    return true;
}

std::unique_ptr<PieceCache> EncoderCore::acquire_cache() {
    {
        std::lock_guard<std::mutex> lock(pool_mu_);
        if (!pool_.empty()) {
            auto c = std::move(pool_.back());
            pool_.pop_back();
            return c;
        }
    }
    return std::make_unique<PieceCache>();
}

void EncoderCore::release_cache(std::unique_ptr<PieceCache> cache) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_.size() < 64) pool_.push_back(std::move(cache));
}

}  // namespace tokcore
