// A minimal JSON writer for snapshots and findings.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace npl {

class Json {
   public:
    Json& open_object() { return punct('{'); }
    Json& close_object() { return close('}'); }
    Json& open_array() { return punct('['); }
    Json& close_array() { return close(']'); }

    Json& key(const char* k) {
        comma();
        string_literal(k);
        out_ += ':';
        need_comma_ = false;
        return *this;
    }
    Json& value(const std::string& s) {
        comma();
        string_literal(s.c_str());
        return done();
    }
    Json& value(const char* s) { return value(std::string(s)); }
    Json& value(bool b) {
        comma();
        out_ += b ? "true" : "false";
        return done();
    }
    Json& value(int64_t v) { return number("%" PRId64, v); }
    Json& value(uint64_t v) { return number("%" PRIu64, v); }
    Json& value(int v) { return value(static_cast<int64_t>(v)); }
    Json& pointer(const void* p) { return value(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p))); }

    const std::string& str() const { return out_; }

   private:
    template <typename T>
    Json& number(const char* fmt, T v) {
        comma();
        char buf[32];
        std::snprintf(buf, sizeof buf, fmt, v);
        out_ += buf;
        return done();
    }
    Json& punct(char c) {
        comma();
        out_ += c;
        need_comma_ = false;
        return *this;
    }
    Json& close(char c) {
        out_ += c;
        return done();
    }
    Json& done() {
        need_comma_ = true;
        return *this;
    }
    void comma() {
        if (need_comma_) out_ += ',';
    }
    void string_literal(const char* s) {
        out_ += '"';
        for (; *s; ++s) {
            unsigned char c = static_cast<unsigned char>(*s);
            if (c == '"' || c == '\\') {
                out_ += '\\';
                out_ += static_cast<char>(c);
            } else if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out_ += buf;
            } else {
                out_ += static_cast<char>(c);
            }
        }
        out_ += '"';
    }

    std::string out_;
    bool need_comma_ = false;
};

}  // namespace npl
