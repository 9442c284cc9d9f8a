/* Frees a shim block from a C atexit handler: after the interpreter has
 * finalised, as torch frees memory held by C++ statics at exit. */
#include <stdlib.h>
#include <sys/types.h>
static void (*shim_free)(void*, ssize_t, int, void*);
static void* block;
static void free_block(void) { shim_free(block, 4096, 0, (void*)0x10); }
void free_at_exit(void* free_fn, void* ptr) { shim_free = (void (*)(void*, ssize_t, int, void*))free_fn; block = ptr; atexit(free_block); }
