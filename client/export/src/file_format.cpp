// The exported program container (file_format.h). See Note [Exported program file] in
// kiln/exported_program.h.
#include "file_format.h"

#include <openssl/evp.h>

#include <array>
#include <cstring>

#include "kiln/error.h"
#include "kiln/ir.h"

namespace kiln::exporting {
namespace {

using Digest = std::array<unsigned char, 32>;

Digest sha256(std::string_view a, std::string_view b) {
  Digest d{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  KILN_CHECK(ctx != nullptr, Runtime, "exported program: out of memory for the checksum");
  unsigned int n = 0;
  const bool ok = EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, a.data(), a.size()) == 1 &&
                  EVP_DigestUpdate(ctx, b.data(), b.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx, d.data(), &n) == 1;
  EVP_MD_CTX_free(ctx);
  KILN_CHECK(ok && n == d.size(), Runtime, "exported program: SHA-256 failed");
  return d;
}

void put_u64(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_u64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

}  // namespace

std::string pack(std::string_view program, std::string_view weights) {
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  put_u64(out, 8, kFormatVersion);  // [8, 12) the version, [12, 16) zero
  put_u64(out, 16, program.size());
  put_u64(out, 24, weights.size());
  const Digest d = sha256(program, weights);
  std::memcpy(out.data() + 32, d.data(), d.size());
  out.reserve(kHeaderBytes + program.size() + weights.size());
  out.append(program);
  out.append(weights);
  return out;
}

Parts unpack(std::string_view file, const std::string& what) {
  KILN_CHECK(file.size() >= kHeaderBytes, Value, what,
             ": not a Kiln exported program: ", file.size(), " bytes, shorter than the ",
             kHeaderBytes, "-byte header (a truncated file?)");
  KILN_CHECK(file.substr(0, kMagic.size()) == kMagic, Value, what,
             ": not a Kiln exported program (no KILNPROG magic at the start)");
  const uint64_t version = get_u64(file, 8);
  KILN_CHECK(version == kFormatVersion, Value, what, ": exported program format version ", version,
             "; this build reads version ", kFormatVersion);
  const uint64_t p = get_u64(file, 16), w = get_u64(file, 24);
  const uint64_t payload = file.size() - kHeaderBytes;
  KILN_CHECK(p <= payload && w <= payload - p, Value, what, ": truncated: the header declares ", p,
             " bytes of program and ", w, " bytes of weights, but only ", payload,
             " bytes follow it");
  KILN_CHECK(p + w == payload, Value, what, ": ", payload - p - w,
             " unexpected bytes after the program and weights the header declares");
  const std::string_view program = file.substr(kHeaderBytes, p);
  const std::string_view weights = file.substr(kHeaderBytes + p, w);
  const Digest d = sha256(program, weights);
  KILN_CHECK(std::memcmp(d.data(), file.data() + 32, d.size()) == 0, Value, what,
             ": the checksum (SHA-256) of the program and weights does not match the header: the "
             "file was altered or corrupted");
  return {program, weights};
}

// A weight as graph input `spec` takes it: the stored tensor, or a view into it where it was
// stored as its whole storage (Note [Exported programs]).
Tensor weight_for(const std::string& what, const std::string& name, const Tensor& stored,
                  const TensorSpec& spec) {
  KILN_CHECK(stored.dtype() == spec.dtype, Value, what, ": weight '", name, "' is ",
             scalar_type_name(stored.dtype()), "; the program reads ", ir::spec_str(spec));
  Tensor t = stored;
  if (!spec.device.is_cpu()) t = t.to(std::nullopt, spec.device);
  if (ir::spec_of(t).sizes == spec.sizes && ir::spec_of(t).strides == spec.strides &&
      spec.offset == 0)
    return t;
  KILN_CHECK(stored.dim() == 1, Value, what, ": weight '", name, "' has shape ",
             ir::spec_str(ir::spec_of(stored)), "; the program reads ", ir::spec_str(spec));
  try {
    return t.as_strided(spec.sizes, spec.strides, spec.offset);
  } catch (const Error& e) {
    KILN_FAIL(Value, what, ": weight '", name, "' cannot hold ", ir::spec_str(spec), ": ",
              e.what());
  }
}

}  // namespace kiln::exporting
