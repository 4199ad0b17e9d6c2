/*
 * A stand-in for Windows' bcryptprimitives.dll, for running vacancyd.exe
 * under Wine 8.0 only: Rust's standard library (>= 1.78) imports ProcessPrng
 * from it, and Wine 8.0 lacks it, so every Rust program fails to start
 * (status c0000135). Windows has the real DLL: this one is never shipped
 * (scripts/windows builds it beside the test build, never into the zip).
 *
 * ProcessPrng fills the buffer from advapi32's SystemFunction036
 * (RtlGenRandom), whose length is a ULONG: larger requests are split.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len > 0) {
    ULONG chunk = len > 0x80000000u ? 0x80000000u : (ULONG)len;
    if (!SystemFunction036(data, chunk)) {
      return FALSE;
    }
    data += chunk;
    len -= chunk;
  }
  return TRUE;
}
