// Document scanner for plain-text corpora: splits a block of bytes into line or paragraph
// documents, packs them contiguously and checks them as UTF-8 (Python's strict codec).
//
// The rules are those of pipeline_lib.corpus._iter_docs (Python's binary readline):
//   * a line ends after '\n' ('\r' alone ends nothing); the last line of the input may lack it;
//   * line mode: a document is a line without its trailing '\r' / '\n' bytes (rstrip(b"\r\n"));
//   * paragraph mode: a line is blank when it holds only ASCII whitespace (bytes.strip());
//     a document is a run of non-blank lines, joined, without trailing '\r' / '\n' bytes;
//   * a document of nothing but ASCII whitespace (or nothing) is no document: it is counted
//     in `empty` (line mode only: a paragraph always holds a non-blank byte).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tokcore {

enum ScanMode : int { kScanLine = 0, kScanParagraph = 1 };

struct ScanResult {
    // Document k is packed[offsets[k], offsets[k + 1]); ends[k] is the input position just
    // after its last line (its terminator included).
    std::vector<int64_t> offsets{0};
    std::vector<int64_t> ends;
    size_t packed_size = 0;
    size_t consumed = 0;  // input bytes fully scanned; the rest (a partial document) comes again
    int64_t lines = 0;    // '\n' in the consumed bytes
    int64_t chars = 0;    // code points of the valid documents
    int64_t empty = 0;    // whitespace-only documents (dropped)
    // Documents that are not valid UTF-8 (packed as they are) and the 0-based line, in the
    // input, where each starts.
    std::vector<int64_t> invalid;
    std::vector<int64_t> invalid_lines;
};

// Scan `n` bytes at `data` into `packed` (room for `n` bytes; `packed == data` packs in place,
// the input past `consumed` left as it was). `final`: the input ends here (a last line without
// '\n' and an open paragraph are documents); otherwise scanning stops before the last
// incomplete line or paragraph, which the caller passes again with more bytes.
ScanResult scan_documents(const uint8_t* data, size_t n, int mode, bool final, uint8_t* packed);

// Code points in `p[0, n)` if it is valid UTF-8 (as Python's strict decoder sees it:
// no overlong forms, surrogates or values past U+10FFFF), else -1.
int64_t utf8_chars(const uint8_t* p, size_t n);

}  // namespace tokcore
