/* VA aperture manager: an AVL tree of live objects augmented with the largest free gap per subtree. */
#include "vaman.h"

#include <errno.h>
#include <stdlib.h>

typedef struct VaNode VaNode;
struct VaNode {
        uint64_t start;
        uint64_t size;
        uint64_t end; /* start + size + guard: where the next object may begin */
        void *data;
        uint64_t gap;     /* free bytes between the previous node's end (or the base) and start */
        uint64_t max_gap; /* largest gap in this subtree */
        VaNode *left, *right, *parent;
        int height;
};

struct ThunkVaSpace {
        uint64_t base;
        uint64_t limit;
        uint64_t guard;
        VaNode *root;
        size_t count;
        uint64_t used;
        ThunkVaSpace *parent; /* set for windows */
};

static int height(const VaNode *n)
{
        return n ? n->height : 0;
}

static uint64_t max_gap(const VaNode *n)
{
        return n ? n->max_gap : 0;
}

static uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
        uint64_t m = a > b ? a : b;
        return m > c ? m : c;
}

static void node_update(VaNode *n)
{
        int hl = height(n->left), hr = height(n->right);
        n->height = 1 + (hl > hr ? hl : hr);
        n->max_gap = max3(n->gap, max_gap(n->left), max_gap(n->right));
}

static void replace_child(ThunkVaSpace *s, VaNode *parent, VaNode *old, VaNode *new)
{
        if (!parent)
                s->root = new;
        else if (parent->left == old)
                parent->left = new;
        else
                parent->right = new;
        if (new)
                new->parent = parent;
}

/*
 * One rotation, to the left (@left) or its mirror: @x goes down on that side and its child on the other side
 * takes its place. Returns that child, the subtree's new root.
 */
static VaNode *rotate(ThunkVaSpace *s, VaNode *x, bool left)
{
        VaNode **x_other = left ? &x->right : &x->left;
        VaNode *y = *x_other;
        VaNode **y_near = left ? &y->left : &y->right;

        replace_child(s, x->parent, x, y);
        *x_other = *y_near;
        if (*x_other)
                (*x_other)->parent = x;
        *y_near = x;
        x->parent = y;
        node_update(x);
        node_update(y);
        return y;
}

/* Recompute books and restore balance from @n up to the root. */
static void rebalance_up(ThunkVaSpace *s, VaNode *n)
{
        while (n) {
                node_update(n);
                int bal = height(n->left) - height(n->right);
                if (bal > 1) {
                        if (height(n->left->left) < height(n->left->right))
                                rotate(s, n->left, true);
                        n = rotate(s, n, false);
                } else if (bal < -1) {
                        if (height(n->right->right) < height(n->right->left))
                                rotate(s, n->right, false);
                        n = rotate(s, n, true);
                }
                n = n->parent;
        }
}

/* Only books change (no shape change): refresh max_gap from @n up. */
static void refresh_up(VaNode *n)
{
        for (; n; n = n->parent)
                node_update(n);
}

static VaNode *node_first(VaNode *n)
{
        while (n && n->left)
                n = n->left;
        return n;
}

static VaNode *node_last(VaNode *n)
{
        while (n && n->right)
                n = n->right;
        return n;
}

static VaNode *node_next(VaNode *n)
{
        if (n->right)
                return node_first(n->right);
        while (n->parent && n->parent->right == n)
                n = n->parent;
        return n->parent;
}

/* The node with the greatest start <= addr, or NULL. */
static VaNode *find_le(const ThunkVaSpace *s, uint64_t addr)
{
        VaNode *n = s->root, *best = NULL;
        while (n) {
                if (n->start <= addr) {
                        best = n;
                        n = n->right;
                } else {
                        n = n->left;
                }
        }
        return best;
}

/* The node with the lowest start >= addr, or NULL. */
static VaNode *find_ge(const ThunkVaSpace *s, uint64_t addr)
{
        VaNode *n = s->root, *best = NULL;
        while (n) {
                if (n->start >= addr) {
                        best = n;
                        n = n->left;
                } else {
                        n = n->right;
                }
        }
        return best;
}

static bool is_page_multiple(uint64_t v)
{
        return (v & (THUNK_VA_PAGE_SIZE - 1)) == 0;
}

static int check_align(uint64_t align)
{
        if (align < THUNK_VA_PAGE_SIZE || (align & (align - 1)) != 0)
                return -EINVAL;
        return 0;
}

int thunk_va_space_new(uint64_t base, uint64_t size, uint64_t guard, ThunkVaSpace **ret)
{
        if (!ret || size == 0 || !is_page_multiple(base) || !is_page_multiple(size) ||
            !is_page_multiple(guard))
                return -EINVAL;
        if (base + size < base)
                return -EOVERFLOW;

        ThunkVaSpace *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->base = base;
        s->limit = base + size;
        s->guard = guard;
        *ret = s;
        return 0;
}

/* A window at @base exactly (@fixed) or anywhere aligned to @align. */
static int window_make(ThunkVaSpace *parent, bool fixed, uint64_t base, uint64_t size, uint64_t align,
                       uint64_t guard, ThunkVaSpace **ret)
{
        ThunkVaSpace *child = NULL;
        uint64_t addr = base;
        int r;

        if (!parent || !ret || !is_page_multiple(guard))
                return -EINVAL;
        /* Create the books first so that the window's data pointer can name them. */
        r = thunk_va_space_new(parent->base, size, guard, &child);
        if (r < 0)
                return r;
        r = fixed ? thunk_va_alloc_fixed(parent, base, size, child)
                  : thunk_va_alloc(parent, size, align, child, &addr);
        if (r < 0) {
                free(child);
                return r;
        }
        child->base = addr;
        child->limit = addr + size;
        child->parent = parent;
        *ret = child;
        return 0;
}

int thunk_va_space_new_window(ThunkVaSpace *parent, uint64_t size, uint64_t align, uint64_t guard,
                              ThunkVaSpace **ret)
{
        return window_make(parent, false, 0, size, align, guard, ret);
}

int thunk_va_space_new_window_at(ThunkVaSpace *parent, uint64_t base, uint64_t size, uint64_t guard,
                                 ThunkVaSpace **ret)
{
        return window_make(parent, true, base, size, 0, guard, ret);
}

int thunk_va_space_new_handles(const ThunkVaInterval *avoid, size_t n_avoid, ThunkVaSpace **ret)
{
        if (!ret || (n_avoid && !avoid))
                return -EINVAL;
        for (uint64_t k = 1; k < (UINT64_MAX / THUNK_VA_HANDLE_STEP); k++) {
                uint64_t lo = k * THUNK_VA_HANDLE_STEP, hi = lo + THUNK_VA_HANDLE_STEP; /* [lo, hi) */
                bool clash = false;
                for (size_t i = 0; i < n_avoid && !clash; i++) {
                        uint64_t a = avoid[i].start, sz = avoid[i].size;
                        if (sz == 0)
                                continue;
                        uint64_t b = a + sz < a ? UINT64_MAX : a + sz; /* clamp a wrapping interval */
                        clash = a < hi && lo < b;
                }
                if (!clash)
                        return thunk_va_space_new(lo, THUNK_VA_HANDLE_STEP, 0, ret);
        }
        return -ENOSPC;
}

ThunkVaSpace *thunk_va_space_free(ThunkVaSpace *s)
{
        if (!s)
                return NULL;
        /* Post-order walk without recursion: descend, free leaves, climb. */
        VaNode *n = s->root;
        while (n) {
                if (n->left) {
                        n = n->left;
                } else if (n->right) {
                        n = n->right;
                } else {
                        VaNode *p = n->parent;
                        if (p) {
                                if (p->left == n)
                                        p->left = NULL;
                                else
                                        p->right = NULL;
                        }
                        free(n);
                        n = p;
                }
        }
        if (s->parent)
                (void)thunk_va_free(s->parent, s->base);
        free(s);
        return NULL;
}

uint64_t thunk_va_space_base(const ThunkVaSpace *s)
{
        return s->base;
}

uint64_t thunk_va_space_limit(const ThunkVaSpace *s)
{
        return s->limit;
}

uint64_t thunk_va_space_guard(const ThunkVaSpace *s)
{
        return s->guard;
}

size_t thunk_va_space_count(const ThunkVaSpace *s)
{
        return s->count;
}

uint64_t thunk_va_space_used(const ThunkVaSpace *s)
{
        return s->used;
}

static uint64_t tail_gap(const ThunkVaSpace *s)
{
        VaNode *last = node_last(s->root);
        uint64_t from = last ? last->end : s->base;
        return from < s->limit ? s->limit - from : 0;
}

uint64_t thunk_va_space_largest_free(const ThunkVaSpace *s)
{
        uint64_t t = tail_gap(s), m = max_gap(s->root);
        return t > m ? t : m;
}

/* Lowest address >= @from aligned to @align such that [addr, addr + need) ends by @to; false if none. */
static bool fit_in(uint64_t from, uint64_t to, uint64_t need, uint64_t align, uint64_t *ret)
{
        uint64_t a = (from + align - 1) & ~(align - 1);
        if (a < from || a > to || to - a < need)
                return false;
        *ret = a;
        return true;
}

/* In-order search of the gaps in front of the nodes of @n, skipping subtrees without a large enough gap. */
static bool first_fit(const VaNode *n, uint64_t need, uint64_t align, uint64_t *ret)
{
        while (n && n->max_gap >= need) {
                if (first_fit(n->left, need, align, ret))
                        return true;
                if (n->gap >= need && fit_in(n->start - n->gap, n->start, need, align, ret))
                        return true;
                n = n->right;
        }
        return false;
}

/* Link a new node for [addr, addr + size) + guard, whose span is known to be free. */
static int insert_node(ThunkVaSpace *s, uint64_t addr, uint64_t size, void *data)
{
        VaNode *nn = calloc(1, sizeof(*nn));
        if (!nn)
                return -ENOMEM;
        nn->start = addr;
        nn->size = size;
        nn->end = addr + size + s->guard;
        nn->data = data;

        VaNode *pred = find_le(s, addr);
        VaNode *succ = pred ? node_next(pred) : node_first(s->root);
        nn->gap = addr - (pred ? pred->end : s->base);
        if (succ) {
                succ->gap = succ->start - nn->end;
                refresh_up(succ);
        }

        VaNode **link = &s->root, *parent = NULL;
        while (*link) {
                parent = *link;
                link = addr < parent->start ? &parent->left : &parent->right;
        }
        *link = nn;
        nn->parent = parent;
        rebalance_up(s, nn);
        s->count++;
        s->used += size;
        return 0;
}

static int check_size(const ThunkVaSpace *s, uint64_t size, uint64_t *ret_need)
{
        if (size == 0 || !is_page_multiple(size))
                return -EINVAL;
        if (size + s->guard < size)
                return -EOVERFLOW;
        *ret_need = size + s->guard;
        return 0;
}

int thunk_va_alloc(ThunkVaSpace *s, uint64_t size, uint64_t align, void *data, uint64_t *ret_addr)
{
        uint64_t need, addr;
        int r;

        if (!s || !ret_addr)
                return -EINVAL;
        r = check_size(s, size, &need);
        if (r >= 0)
                r = check_align(align);
        if (r < 0)
                return r;
        if (need > s->limit - s->base)
                return -ENOMEM;

        if (!first_fit(s->root, need, align, &addr)) {
                VaNode *last = node_last(s->root);
                if (!fit_in(last ? last->end : s->base, s->limit, need, align, &addr))
                        return -ENOMEM;
        }
        r = insert_node(s, addr, size, data);
        if (r < 0)
                return r;
        *ret_addr = addr;
        return 0;
}

int thunk_va_alloc_fixed(ThunkVaSpace *s, uint64_t addr, uint64_t size, void *data)
{
        uint64_t need;
        int r;

        if (!s || !is_page_multiple(addr))
                return -EINVAL;
        r = check_size(s, size, &need);
        if (r < 0)
                return r;
        if (addr + need < addr)
                return -EOVERFLOW;
        if (addr < s->base || addr + need > s->limit)
                return -ERANGE;

        VaNode *pred = find_le(s, addr);
        if (pred && pred->end > addr)
                return -EADDRINUSE;
        VaNode *succ = pred ? node_next(pred) : node_first(s->root);
        if (succ && succ->start < addr + need)
                return -EADDRINUSE;
        return insert_node(s, addr, size, data);
}

int thunk_va_free(ThunkVaSpace *s, uint64_t addr)
{
        if (!s)
                return -EINVAL;
        VaNode *z = find_le(s, addr);
        if (!z || z->start != addr)
                return -ENOENT;

        /* The follower's gap absorbs this object, its guard and the gap in front of it. */
        VaNode *succ = node_next(z);
        if (succ) {
                succ->gap += z->gap + (z->end - z->start);
                refresh_up(succ);
        }
        s->count--;
        s->used -= z->size;

        if (z->left && z->right) {
                /* Move the successor's payload here and unlink the successor node instead. */
                VaNode *y = node_first(z->right);
                z->start = y->start;
                z->size = y->size;
                z->end = y->end;
                z->data = y->data;
                z->gap = y->gap;
                z = y;
        }
        VaNode *child = z->left ? z->left : z->right;
        VaNode *parent = z->parent;
        replace_child(s, parent, z, child);
        free(z);
        rebalance_up(s, parent);
        return 0;
}

static void to_object(const VaNode *n, ThunkVaObject *ret)
{
        ret->start = n->start;
        ret->size = n->size;
        ret->data = n->data;
}

int thunk_va_lookup(const ThunkVaSpace *s, uint64_t addr, ThunkVaObject *ret)
{
        if (!s || !ret)
                return -EINVAL;
        const VaNode *n = find_le(s, addr);
        if (!n || addr - n->start >= n->size)
                return -ENOENT;
        to_object(n, ret);
        return 0;
}

int thunk_va_next(const ThunkVaSpace *s, uint64_t addr, ThunkVaObject *ret)
{
        if (!s || !ret)
                return -EINVAL;
        const VaNode *n = find_ge(s, addr);
        if (!n)
                return -ENOENT;
        to_object(n, ret);
        return 0;
}

int thunk_va_foreach(const ThunkVaSpace *s, int (*fn)(const ThunkVaObject *obj, void *userdata),
                     void *userdata)
{
        if (!s || !fn)
                return -EINVAL;
        for (VaNode *n = node_first(s->root); n; n = node_next(n)) {
                ThunkVaObject o;
                to_object(n, &o);
                int r = fn(&o, userdata);
                if (r)
                        return r;
        }
        return 0;
}

/* Returns the subtree height, or -1 on a broken invariant. */
static int verify_node(const VaNode *n, const VaNode *parent)
{
        if (!n)
                return 0;
        if (n->parent != parent)
                return -1;
        int hl = verify_node(n->left, n), hr = verify_node(n->right, n);
        if (hl < 0 || hr < 0 || hl - hr > 1 || hr - hl > 1)
                return -1;
        if (n->height != 1 + (hl > hr ? hl : hr))
                return -1;
        if (n->max_gap != max3(n->gap, max_gap(n->left), max_gap(n->right)))
                return -1;
        return n->height;
}

int thunk_va_space_verify(const ThunkVaSpace *s)
{
        if (!s)
                return -EINVAL;
        if (verify_node(s->root, NULL) < 0)
                return -EUCLEAN;
        uint64_t prev_end = s->base, used = 0;
        size_t count = 0;
        for (VaNode *n = node_first(s->root); n; n = node_next(n)) {
                if (n->start < prev_end || n->gap != n->start - prev_end || n->size == 0 ||
                    n->end != n->start + n->size + s->guard || n->end > s->limit)
                        return -EUCLEAN;
                prev_end = n->end;
                used += n->size;
                count++;
        }
        if (count != s->count || used != s->used)
                return -EUCLEAN;
        return 0;
}
