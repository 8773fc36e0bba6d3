/* Loaded first (LD_PRELOAD) by rlvr on AMD CPUs with AVX-512: see rlvr/cpu/runtime_env.py.
 *
 * oneMKL (linked into PyTorch's CPU library) runs its AVX-512 kernels only on CPUs that it reads as
 * Intel's; on any other CPU it takes its AVX2 kernels, whatever the CPU supports. This definition
 * answers MKL's vendor check with "yes", so MKL picks its kernels from the CPU's feature flags
 * (CPUID), as it does on an Intel CPU. It changes nothing in programs without MKL.
 */
int mkl_serv_intel_cpu_true(void) { return 1; }
