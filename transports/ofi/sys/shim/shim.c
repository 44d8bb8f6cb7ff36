/* See shim.h: thin forwarders for libfabric's static inline calls. */
#include "shim.h"

uint32_t fmx_fi_header_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }

uint64_t fmx_fi_context_modes(void) {
    uint64_t m = 0;
#ifdef FI_CONTEXT
    m |= FI_CONTEXT;
#endif
#ifdef FI_CONTEXT2
    m |= FI_CONTEXT2;
#endif
    return m;
}

int fmx_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
    return fi_fabric(attr, fabric, context);
}
int fmx_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context) {
    return fi_domain(fabric, info, domain, context);
}
int fmx_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context) {
    return fi_endpoint(domain, info, ep, context);
}
int fmx_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context) {
    return fi_cq_open(domain, attr, cq, context);
}
int fmx_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context) {
    return fi_av_open(domain, attr, av, context);
}
int fmx_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int fmx_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int fmx_fi_getname(struct fid_ep *ep, void *addr, size_t *addrlen) { return fi_getname(&ep->fid, addr, addrlen); }
int fmx_fi_setname(struct fid_ep *ep, void *addr, size_t addrlen) { return fi_setname(&ep->fid, addr, addrlen); }
int fmx_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context) {
    return fi_av_insert(av, addr, count, fi_addr, flags, context);
}
int fmx_fi_close(struct fid *fid) { return fi_close(fid); }

int fmx_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access, uint64_t offset,
                  uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context) {
    return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context);
}
void *fmx_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t fmx_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
int fmx_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags) { return fi_mr_bind(mr, bfid, flags); }
int fmx_fi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }

ssize_t fmx_fi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag,
                     void *context) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_tsend(ep, buf, len, desc, dest_addr, tag, context);
}
ssize_t fmx_fi_tinject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t tag) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_tinject(ep, buf, len, dest_addr, tag);
}
ssize_t fmx_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag,
                     uint64_t ignore, void *context) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context);
}
ssize_t fmx_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t addr,
                    uint64_t key, void *context) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_read(ep, buf, len, desc, src_addr, addr, key, context);
}
ssize_t fmx_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t addr,
                     uint64_t key, void *context) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_write(ep, buf, len, desc, dest_addr, addr, key, context);
}
ssize_t fmx_fi_inject_write(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t addr,
                            uint64_t key) {
    if (!ep) return -FI_ECANCELED; /* closed on purpose: see OfiEndpoint::abandon */
    return fi_inject_write(ep, buf, len, dest_addr, addr, key);
}

ssize_t fmx_fi_cq_read(struct fid_cq *cq, void *buf, size_t count) { return fi_cq_read(cq, buf, count); }
ssize_t fmx_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags) {
    return fi_cq_readerr(cq, buf, flags);
}
const char *fmx_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len) {
    return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}
