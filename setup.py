"""The one compiled part: region decoding of JPEG against the system's libjpeg-turbo
(zephon._jpeg). Optional: without libjpeg-turbo's headers it is skipped and JPEG decodes
through simplejpeg or Pillow, whole."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("zephon._jpeg", ["src/zephon/_jpeg.c"], libraries=["jpeg"], optional=True)
    ]
)
