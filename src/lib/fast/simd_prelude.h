// Bit casts, loads and stores of GCC vector types, shared by the per-ISA
// copies of the kernels (kernels_impl.h) and of the sorting networks
// (sort_impl.h). No include guard and no namespace on purpose: each copy
// includes it inside its own instruction-set namespace, after its
// `#pragma GCC target`, so that every copy gets its own instantiations
// (one shared instantiation could carry AVX-512 code into the generic path).
template <class To, class From>
inline To bits_as(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
  To t;
  __builtin_memcpy(&t, &f, sizeof(To));
  return t;
}
template <class V, class T>
inline V load(const T* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void store(T* p, const V& v) {
  __builtin_memcpy(p, &v, sizeof(V));
}
