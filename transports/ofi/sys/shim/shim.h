/* fmx-ofi-sys: the libfabric calls fmx uses that the headers define as
 * static inline functions (bindgen cannot link to those). Each wrapper
 * forwards its arguments unchanged. */
#ifndef FMX_OFI_SHIM_H
#define FMX_OFI_SHIM_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

/* The API version of the headers we were built against. */
uint32_t fmx_fi_header_version(void);

/* The context mode bits these headers define (FI_CONTEXT, FI_CONTEXT2): fmx
 * gives every operation a context of fi_context2 size, so it accepts both.
 * A function, not the macros, so that headers without one of them build. */
uint64_t fmx_fi_context_modes(void);

int fmx_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
int fmx_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context);
int fmx_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
int fmx_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
int fmx_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
int fmx_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int fmx_fi_enable(struct fid_ep *ep);
int fmx_fi_getname(struct fid_ep *ep, void *addr, size_t *addrlen);
int fmx_fi_setname(struct fid_ep *ep, void *addr, size_t addrlen);
int fmx_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context);
int fmx_fi_close(struct fid *fid);

int fmx_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset,
                  uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
void *fmx_fi_mr_desc(struct fid_mr *mr);
uint64_t fmx_fi_mr_key(struct fid_mr *mr);
int fmx_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int fmx_fi_mr_enable(struct fid_mr *mr);

ssize_t fmx_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag,
                     void *context);
ssize_t fmx_fi_tinject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t tag);
ssize_t fmx_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag,
                     uint64_t ignore, void *context);
ssize_t fmx_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t addr,
                    uint64_t key, void *context);
ssize_t fmx_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t addr,
                     uint64_t key, void *context);
ssize_t fmx_fi_inject_write(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t addr,
                            uint64_t key);

ssize_t fmx_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t fmx_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *fmx_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);

#endif
