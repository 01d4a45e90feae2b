// The web's Request and Response as a fetch handler meets them on server/wire.ts, made only as far as
// the handler reads them, as @hono/node-server does on node:http. A request arrives as an
// IncomingRequest: its method, URL and header fields as the reader found them, its body the bytes
// already read; what else a handler asks of it (a signal, formData) a real Request answers, built then.
// A Response whose body is a string, bytes or nothing keeps what it was given, for the server to write
// as it is: no web Response or Headers is built only to be read back.
const WebRequest = globalThis.Request
const WebResponse = globalThis.Response
const WebHeaders = globalThis.Headers

// The header fields of a request: name (lower case), value, name, value... Looked up where they are;
// a real Headers is built for anything more (iterating, changing).
export class RequestHeaders {
  #fields: string[]
  #headers?: Headers

  constructor(fields: string[]) {
    this.#fields = fields
  }

  get(name: string): string | null {
    if (this.#headers) return this.#headers.get(name)
    const key = name.toLowerCase()
    const fields = this.#fields
    let value: string | null = null
    for (let i = 0; i < fields.length; i += 2) {
      if (fields[i] !== key) continue
      // Repeated fields are one, comma-separated (RFC 9110, 5.3), as Node joins them; cookies by "; ".
      value = value === null ? fields[i + 1] : `${value}${key === 'cookie' ? '; ' : ', '}${fields[i + 1]}`
    }
    return value
  }

  has(name: string): boolean {
    return this.get(name) !== null
  }

  get web(): Headers {
    if (!this.#headers) {
      this.#headers = new WebHeaders()
      for (let i = 0; i < this.#fields.length; i += 2) this.#headers.append(this.#fields[i], this.#fields[i + 1])
    }
    return this.#headers
  }
}
for (const name of [
  'append',
  'delete',
  'set',
  'forEach',
  'entries',
  'keys',
  'values',
  'getSetCookie',
  Symbol.iterator,
] as const) {
  Object.defineProperty(RequestHeaders.prototype, name, {
    value(this: RequestHeaders, ...args: unknown[]) {
      return (this.web[name] as (...args: unknown[]) => unknown)(...args)
    },
  })
}
Object.setPrototypeOf(RequestHeaders.prototype, WebHeaders.prototype)

const unusable = () => Promise.reject(new TypeError('Body is unusable: it has already been read'))

// A request as server/wire.ts read it. GET and HEAD have no body here, as in a real Request.
export class IncomingRequest {
  readonly method: string
  readonly url: string
  #fields: string[]
  #headers?: RequestHeaders
  #body: Buffer | null
  #used = false
  #request?: Request
  #abort?: AbortController

  constructor(method: string, url: string, fields: string[], body: Buffer | null) {
    this.method = method
    this.url = url
    this.#fields = fields
    this.#body = method === 'GET' || method === 'HEAD' ? null : body
  }

  get headers(): RequestHeaders {
    return (this.#headers ??= new RequestHeaders(this.#fields))
  }

  get body(): ReadableStream<Uint8Array> | null {
    return this.#body === null && !this.#request ? null : this.web.body
  }

  get bodyUsed(): boolean {
    return this.#used || (this.#request?.bodyUsed ?? false)
  }

  arrayBuffer(): Promise<ArrayBuffer> {
    return this.#read(
      (bytes) => bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) as ArrayBuffer,
      'arrayBuffer',
    )
  }

  bytes(): Promise<Uint8Array> {
    return this.#read((bytes) => new Uint8Array(bytes), 'bytes')
  }

  text(): Promise<string> {
    return this.#read((bytes) => bytes.toString('utf8'), 'text')
  }

  json(): Promise<unknown> {
    return this.text().then(JSON.parse)
  }

  // Aborts `signal`: the connection closed before the answer went.
  abort(reason: unknown) {
    this.#abort?.abort(reason)
  }

  get signal(): AbortSignal {
    return (this.#abort ??= new AbortController()).signal
  }

  // The real Request, for whatever this one does not answer itself.
  get web(): Request {
    if (!this.#request) {
      const body = this.#used ? new Uint8Array(0) : this.#body
      this.#request = new WebRequest(this.url, {
        method: this.method,
        headers: this.headers.web,
        body: body as Uint8Array<ArrayBuffer> | null,
        signal: this.signal,
      })
      this.#body = null
    }
    return this.#request
  }

  #read<T>(convert: (bytes: Buffer) => T, via: 'arrayBuffer' | 'bytes' | 'text'): Promise<T> {
    if (this.#request) return this.#request[via]() as Promise<T>
    if (this.#used) return unusable()
    this.#used = true
    return Promise.resolve(convert(this.#body ?? Buffer.alloc(0)))
  }
}
for (const name of [
  'cache',
  'credentials',
  'destination',
  'duplex',
  'integrity',
  'keepalive',
  'mode',
  'redirect',
  'referrer',
  'referrerPolicy',
] as const) {
  Object.defineProperty(IncomingRequest.prototype, name, {
    get(this: IncomingRequest) {
      return (this.web as unknown as Record<string, unknown>)[name]
    },
  })
}
for (const name of ['blob', 'formData', 'clone'] as const) {
  Object.defineProperty(IncomingRequest.prototype, name, {
    value(this: IncomingRequest) {
      return (this.web[name] as () => unknown)()
    },
  })
}
Object.setPrototypeOf(IncomingRequest.prototype, WebRequest.prototype)

// What a Response was given, when its body is a string, bytes or nothing: written as it is.
export const GIVEN = Symbol('the status, body and headers a Response was given')
export type Given = { status: number; body: string | Uint8Array | null; headers?: HeadersInit }
type Init = ResponseInit | Response | undefined

// A Response that keeps what it was given, and builds a real one only if asked for more than its status
// and headers. `instanceof Response` holds for it and for real ones (fetch's).
export class Response {
  [GIVEN]?: Given
  #body: BodyInit | null | undefined
  #init: ResponseInit | undefined
  #response?: globalThis.Response

  static [Symbol.hasInstance](value: unknown): boolean {
    return value instanceof WebResponse || Function.prototype[Symbol.hasInstance].call(this, value)
  }

  constructor(body?: BodyInit | null, init?: Init) {
    // A response made from another (Hono's HEAD, say) takes its status and headers.
    const from: ResponseInit | undefined =
      init instanceof Response
        ? { status: init.status, statusText: init.statusText, headers: init.headers }
        : (init as ResponseInit | undefined)
    this.#body = body
    this.#init = from
    if (body == null || typeof body === 'string' || body instanceof Uint8Array) {
      const status = from?.status ?? 200
      if (!(status >= 200 && status <= 599))
        throw new RangeError(`a Response's status must be from 200 to 599, not ${status}`)
      this[GIVEN] = { status, body: body ?? null, headers: from?.headers }
    }
  }

  get status(): number {
    return this[GIVEN]?.status ?? this.web.status
  }

  get ok(): boolean {
    return this.status >= 200 && this.status < 300
  }

  get statusText(): string {
    return this[GIVEN] ? (this.#init?.statusText ?? '') : this.web.statusText
  }

  // Headers asked for become a real Headers, kept with what was given, so that changes to them are
  // written.
  get headers(): Headers {
    const given = this[GIVEN]
    if (!given) return this.web.headers
    if (!(given.headers instanceof WebHeaders)) {
      const headers = new WebHeaders(given.headers)
      if (typeof given.body === 'string' && !headers.has('content-type'))
        headers.set('content-type', 'text/plain;charset=UTF-8')
      given.headers = headers
    }
    return given.headers as Headers
  }

  // The real Response, for whatever this one does not answer itself; from then on it is written.
  get web(): globalThis.Response {
    if (!this.#response) {
      const given = this[GIVEN]
      const init = given
        ? { status: given.status, statusText: this.#init?.statusText, headers: given.headers }
        : this.#init
      this.#response = new WebResponse(this.#body as BodyInit, init)
      delete this[GIVEN]
    }
    return this.#response
  }
}
for (const name of ['body', 'bodyUsed', 'redirected', 'type', 'url'] as const) {
  Object.defineProperty(Response.prototype, name, {
    get(this: Response) {
      return this.web[name]
    },
  })
}
for (const name of ['arrayBuffer', 'blob', 'bytes', 'clone', 'formData', 'json', 'text'] as const) {
  Object.defineProperty(Response.prototype, name, {
    value(this: Response) {
      return (this.web[name] as () => unknown)()
    },
  })
}
for (const name of ['json', 'error', 'redirect'] as const)
  Object.defineProperty(Response, name, { value: WebResponse[name].bind(WebResponse) })
Object.setPrototypeOf(Response.prototype, WebResponse.prototype)

// From now on `new Response(...)` anywhere in the process, Hono's and the API's, makes one of these.
export function useGivenResponses() {
  if (globalThis.Response !== (Response as unknown))
    Object.defineProperty(globalThis, 'Response', { value: Response, writable: true, configurable: true })
}
