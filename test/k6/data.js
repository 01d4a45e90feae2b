// Stand-in for k6's `k6/data`: a SharedArray is the array its function returns.
export class SharedArray {
  constructor(name, load) {
    return load()
  }
}
