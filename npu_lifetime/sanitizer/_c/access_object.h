/* accesses.StorageAccess's native base (_scan.c's AccessBase): its slots, in
 * one layout that _scan.c makes and fills and _feed.c reads directly. */
#pragma once

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *storage, *is_write, *tensor, *names, *device_index, *fresh, *accessed;
} AccessObject;
