#include "scan.h"

#include <cstring>

#include "cancel.h"

namespace tokcore {

namespace {

// bytes.isspace() / bytes.strip(): ASCII space, \t, \n, \v, \f, \r
inline bool ascii_space(uint8_t b) { return b == ' ' || (b >= '\t' && b <= '\r'); }

inline bool blank(const uint8_t* p, size_t n) {
    for (size_t k = 0; k < n; ++k)
        if (!ascii_space(p[k])) return false;
    return true;
}

// End of `p[begin, end)` without its trailing '\r' / '\n' bytes (rstrip(b"\r\n")).
inline size_t rstrip_newlines(const uint8_t* p, size_t begin, size_t end) {
    while (end > begin && (p[end - 1] == '\n' || p[end - 1] == '\r')) --end;
    return end;
}

class Packer {
public:
    Packer(const uint8_t* data, uint8_t* packed, ScanResult& out) : data_(data), packed_(packed), out_(out) {}

    // The document data[begin, end), whose last line ends at `line_end`, starting at `first_line`.
    void emit(size_t begin, size_t end, size_t line_end, int64_t first_line) {
        const uint8_t* doc = data_ + begin;
        const size_t len = end - begin;
        if (blank(doc, len)) {
            ++out_.empty;
            return;
        }
        const int64_t chars = utf8_chars(doc, len);
        if (chars < 0) {
            out_.invalid.push_back(static_cast<int64_t>(out_.ends.size()));
            out_.invalid_lines.push_back(first_line);
        } else {
            out_.chars += chars;
        }
        // packing in place moves the document back (packed_size <= begin), over bytes already scanned
        std::memmove(packed_ + out_.packed_size, doc, len);
        out_.packed_size += len;
        out_.offsets.push_back(static_cast<int64_t>(out_.packed_size));
        out_.ends.push_back(static_cast<int64_t>(line_end));
    }

private:
    const uint8_t* data_;
    uint8_t* packed_;
    ScanResult& out_;
};

}  // namespace

int64_t utf8_chars(const uint8_t* p, size_t n) {
    size_t i = 0;
    int64_t chars = 0;
    while (i < n) {
        while (i + 8 <= n) {  // ASCII runs, 8 bytes at a time
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
            chars += 8;
        }
        if (i >= n) break;
        const uint8_t b = p[i];
        if (b < 0x80) {
            ++i;
            ++chars;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
        if (b >= 0xC2 && b <= 0xDF) {
            len = 2;
        } else if (b == 0xE0) {
            len = 3;
            lo = 0xA0;  // no overlong forms
        } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
            len = 3;
        } else if (b == 0xED) {
            len = 3;
            hi = 0x9F;  // no surrogates
        } else if (b == 0xF0) {
            len = 4;
            lo = 0x90;
        } else if (b >= 0xF1 && b <= 0xF3) {
            len = 4;
        } else if (b == 0xF4) {
            len = 4;
            hi = 0x8F;  // up to U+10FFFF
        } else {
            return -1;
        }
        if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return -1;
        for (size_t k = 2; k < len; ++k)
            if ((p[i + k] & 0xC0) != 0x80) return -1;
        i += len;
        ++chars;
    }
    return chars;
}

ScanResult scan_documents(const uint8_t* data, size_t n, int mode, bool final, uint8_t* packed) {
    ScanResult out;
    Packer packer(data, packed, out);
    cancel::Poll& poll = cancel::current();
    size_t pos = 0;    // start of the next line
    int64_t line = 0;  // its 0-based number
    // paragraph mode: the open paragraph's first byte, end of its last line, first line
    bool open = false;
    size_t para_begin = 0, para_end = 0;
    int64_t para_line = 0;
    while (pos < n) {
        const void* nl = std::memchr(data + pos, '\n', n - pos);
        size_t end;
        if (nl != nullptr)
            end = static_cast<size_t>(static_cast<const uint8_t*>(nl) - data) + 1;
        else if (final)
            end = n;
        else
            break;  // an incomplete last line: it comes again with the next block
        poll.tick(end - pos);
        if (mode == kScanLine) {
            packer.emit(pos, rstrip_newlines(data, pos, end), end, line);
        } else if (blank(data + pos, end - pos)) {
            if (open) packer.emit(para_begin, rstrip_newlines(data, para_begin, para_end), para_end, para_line);
            open = false;
        } else {
            if (!open) {
                open = true;
                para_begin = pos;
                para_line = line;
            }
            para_end = end;
        }
        pos = end;
        if (nl != nullptr) ++line;
    }
    if (open && final) {
        packer.emit(para_begin, rstrip_newlines(data, para_begin, para_end), para_end, para_line);
        open = false;
    }
    // An open paragraph may go on in the next block: it is scanned again from its start.
    out.consumed = open ? para_begin : pos;
    out.lines = open ? para_line : line;
    return out;
}

}  // namespace tokcore
