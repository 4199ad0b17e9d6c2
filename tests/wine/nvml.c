/*
 * A stand-in for the NVIDIA driver's nvml.dll, for the Wine tests of GPU
 * pressure only (tests/daemon/windows.rs): Wine has no nvml.dll, so without
 * this one the Windows build's pressure reading is unavailable from the
 * start and accepted work on the GPU can never exist. It is never shipped:
 * scripts/windows builds it into a folder of its own, and only the test that
 * asks for it puts that folder on the daemon's search path (WINEPATH).
 *
 * One GPU (index 0) with 24000 MiB, 20000 free, no processes and no
 * utilization samples: the owner's load reads 0 % / 0 MiB. The file named by
 * VACANCY_NVML_STANDIN says how reads go: while its first byte is 'f', the
 * process lists answer NVML_ERROR_GPU_IS_LOST (a failed attribution read);
 * otherwise they answer. Memory is always answered, so the capacity sampler
 * is not what refuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_GPU_IS_LOST = 15,
};

typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static int the_device;

static int failing(void) {
  const char *path = getenv("VACANCY_NVML_STANDIN");
  if (path == NULL) {
    return 0;
  }
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    return 0;
  }
  int c = fgetc(f);
  fclose(f);
  return c == 'f';
}

__declspec(dllexport) nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
__declspec(dllexport) nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  return NVML_SUCCESS;
}
__declspec(dllexport) nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

__declspec(dllexport) const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case NVML_SUCCESS: return "Success";
  case NVML_ERROR_NOT_FOUND: return "Not Found";
  case NVML_ERROR_GPU_IS_LOST: return "GPU is lost (the Wine stand-in nvml.dll was told to fail)";
  default: return "Unknown Error";
  }
}

__declspec(dllexport) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
  if (index != 0 || device == NULL) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *device = &the_device;
  return NVML_SUCCESS;
}

__declspec(dllexport) nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
  if (device != &the_device || memory == NULL) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  memory->total = 24000ull << 20;
  memory->reserved = 0;
  memory->free = 20000ull << 20;
  memory->used = memory->total - memory->free;
  return NVML_SUCCESS;
}

static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count) {
  if (device != &the_device || count == NULL) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (failing()) {
    return NVML_ERROR_GPU_IS_LOST;
  }
  *count = 0;
  return NVML_SUCCESS;
}

__declspec(dllexport) nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
  (void)infos;
  return no_processes(device, count);
}

__declspec(dllexport) nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
  (void)infos;
  return no_processes(device, count);
}

/* No process had a sample: vacancy reads the owner's utilization as 0. */
__declspec(dllexport) nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, void *samples, unsigned int *count, unsigned long long last_seen) {
  (void)samples;
  (void)last_seen;
  if (device != &the_device || count == NULL) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (failing()) {
    return NVML_ERROR_GPU_IS_LOST;
  }
  return NVML_ERROR_NOT_FOUND;
}
