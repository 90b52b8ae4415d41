/* Lets <linux/kfd_ioctl.h>'s "#include <drm/drm.h>" resolve on distributions that ship the DRM uapi in
 * libdrm. */
#pragma once

#include <libdrm/drm.h>
