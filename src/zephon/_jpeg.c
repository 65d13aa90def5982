/* Region decoding of JPEG through the libjpeg API of libjpeg-turbo.
 *
 * A random-resized crop keeps on average about half of an image. libjpeg-turbo can skip the
 * inverse DCT, upsampling and colour conversion of the rows above the crop
 * (jpeg_skip_scanlines), stop decoding at its last row, and skip those stages for the columns
 * outside it (jpeg_crop_scanline): about a third less work per image than decoding it whole
 * and cutting the crop out. No Python package exposes this, so this module does, with two
 * functions:
 *
 *   output_size(data, scale_denom) -> (height, width, channels_in_file)
 *   decode(data, out, gray, scale_denom, top, left, height, width)
 *
 * ``decode`` writes the region (in the image decoded at 1/scale_denom) into ``out``, a
 * writable C-contiguous buffer of height * width * (1 if gray else 3) bytes, with the GIL
 * released. The region's pixels are exactly those of the whole image decoded the same way
 * (tests/unit/test_jpeg_regions.py): columns are decoded with a margin, since the fancy
 * upsampling of subsampled chroma reads a neighbouring column. Any libjpeg error or warning
 * (a corrupt or truncated stream) raises ValueError; CMYK/YCCK files raise NotImplementedError
 * (the caller decodes them another way).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

/* jpeg_skip_scanlines and jpeg_crop_scanline came in 1.5; the 2.0 series fixed crashes and
 * wrong rows in them for some subsamplings. Built against 2.1.5 here. */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "zephon._jpeg needs libjpeg-turbo >= 2.1"
#endif

#define MARGIN 16 /* columns decoded beyond each side of a crop: one MCU of 4:2:0 */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
    int failed;
} errors_t;

static void on_error(j_common_ptr cinfo) {
    errors_t *err = (errors_t *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    err->failed = 1;
    longjmp(err->escape, 1);
}

/* A warning (level -1) means damaged data that libjpeg would paper over with grey: an error
 * here, as for the other decoders. Trace messages (level >= 0) are ignored. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) on_error(cinfo);
}

static int header(struct jpeg_decompress_struct *c, errors_t *err, const Py_buffer *data,
                  int scale_denom) {
    c->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->failed = 0;
    jpeg_create_decompress(c);
    jpeg_mem_src(c, (const unsigned char *)data->buf, (unsigned long)data->len);
    jpeg_read_header(c, TRUE);
    c->scale_num = 1;
    c->scale_denom = (unsigned int)scale_denom;
    c->dct_method = JDCT_ISLOW;
    c->do_fancy_upsampling = TRUE;
    return c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK;
}

static int check_scale(int scale_denom) {
    if (scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8) return 1;
    PyErr_SetString(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8");
    return 0;
}

static PyObject *output_size(PyObject *self, PyObject *args) {
    Py_buffer data;
    int scale_denom;
    struct jpeg_decompress_struct c;
    errors_t err;
    unsigned int height = 0, width = 0;
    int channels = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*i", &data, &scale_denom)) return NULL;
    if (!check_scale(scale_denom)) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (setjmp(err.escape) == 0) {
        header(&c, &err, &data, scale_denom);
        jpeg_calc_output_dimensions(&c);
        height = c.output_height;
        width = c.output_width;
        channels = c.num_components;
    }
    jpeg_destroy_decompress(&c);
    PyBuffer_Release(&data);
    if (err.failed) return PyErr_Format(PyExc_ValueError, "%s", err.message);
    return Py_BuildValue("(IIi)", height, width, channels);
}

/* Long because libjpeg's error handling is a setjmp in the function that owns the state. */
static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int gray, scale_denom;
    volatile int unsupported = 0, bad_region = 0; /* set after setjmp, read after longjmp */
    unsigned int top, left, height, width;
    struct jpeg_decompress_struct c;
    errors_t err;
    unsigned char *volatile row = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*piIIII", &data, &out, &gray, &scale_denom, &top, &left,
                          &height, &width))
        return NULL;
    const unsigned int channels = gray ? 1 : 3;
    if (!check_scale(scale_denom)) goto released;
    if ((size_t)out.len != (size_t)height * width * channels || height == 0 || width == 0) {
        PyErr_SetString(PyExc_ValueError, "out must hold height * width * channels bytes");
        goto released;
    }
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.escape) == 0) {
        unsupported = header(&c, &err, &data, scale_denom);
        if (!unsupported) {
            c.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
            jpeg_start_decompress(&c);
            /* Compared without sums: top + height wraps at 2**32 */
            if (height > c.output_height || top > c.output_height - height ||
                width > c.output_width || left > c.output_width - width) {
                bad_region = 1;
            } else {
                JDIMENSION x = left > MARGIN ? left - MARGIN : 0;
                JDIMENSION end = left + width + MARGIN;
                JDIMENSION span = (end < c.output_width ? end : c.output_width) - x;
                if (span < c.output_width) jpeg_crop_scanline(&c, &x, &span);
                /* x moved down to an iMCU boundary; the crop starts (left - x) into a row */
                row = malloc((size_t)span * channels);
                if (row == NULL) {
                    snprintf(err.message, sizeof err.message, "out of memory");
                    err.failed = 1;
                } else {
                    if (top > 0) jpeg_skip_scanlines(&c, top);
                    unsigned char *dst = out.buf;
                    while (c.output_scanline < top + height) {
                        JSAMPROW rows[1] = {row};
                        jpeg_read_scanlines(&c, rows, 1);
                        memcpy(dst, row + (size_t)(left - x) * channels,
                               (size_t)width * channels);
                        dst += (size_t)width * channels;
                    }
                }
            }
        }
    }
    jpeg_destroy_decompress(&c);
    Py_END_ALLOW_THREADS
    free(row);
    if (unsupported) {
        PyErr_SetString(PyExc_NotImplementedError, "CMYK/YCCK JPEG");
    } else if (err.failed) {
        PyErr_Format(PyExc_ValueError, "%s", err.message);
    } else if (bad_region) {
        PyErr_SetString(PyExc_ValueError, "region outside the decoded image");
    }
released:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"output_size", output_size, METH_VARARGS,
     "output_size(data, scale_denom) -> (height, width, channels in the file)"},
    {"decode", decode, METH_VARARGS,
     "decode(data, out, gray, scale_denom, top, left, height, width): the region into out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zephon._jpeg", "JPEG region decoding (libjpeg-turbo).", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
                                              LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
