// The challenge's load, for k6 (https://k6.io). Each virtual user is one reader with one
// keep-alive connection, about 0.106 requests a second:
//
//   k6 run -e VUS=5000 load.js
//   k6 run -e BASE_URL=http://10.0.0.2:3000 -e VUS=20000 -e MIX=write-heavy -e TOKENS=/srv/tokens.json load.js
//
// The thresholds are the challenge's pass criteria: k6 exits non-zero when a level fails.
import { check, sleep } from 'k6'
import { SharedArray } from 'k6/data'
import http from 'k6/http'

const BASE_URL = __ENV.BASE_URL || 'http://localhost:3000'
const VUS = Number(__ENV.VUS || 2500)
const RAMP_UP = __ENV.RAMP_UP || '60s'
const DURATION = __ENV.DURATION || '5m'
// The challenge's ramp-down, and the time a user's loop gets to finish in it.
const RAMP_DOWN = __ENV.RAMP_DOWN || '30s'
const MIX = __ENV.MIX || 'realistic'
const TOKENS = __ENV.TOKENS || './data/tokens.json'

// How often a user likes the post it opened, and writes one of its own.
const MIXES = {
  realistic: { like: 0.15, write: 0.02 },
  'write-heavy': { like: 1, write: 0.5 },
}
const mix = MIXES[MIX]
if (!mix) throw new Error(`MIX must be one of ${Object.keys(MIXES).join(', ')}, not ${MIX}`)
if (!(VUS > 0)) throw new Error(`VUS must be a positive number, not ${__ENV.VUS}`)

// Loaded once and shared by every virtual user (tokens.json is written by the seed).
const tokens = new SharedArray('tokens', () => JSON.parse(open(TOKENS)).map((user) => user.token))

export const options = {
  scenarios: {
    users: {
      executor: 'ramping-vus',
      startVUs: 0,
      stages: [
        { duration: RAMP_UP, target: VUS },
        { duration: DURATION, target: VUS },
        { duration: RAMP_DOWN, target: 0 },
      ],
      gracefulRampDown: RAMP_DOWN,
    },
  },
  thresholds: {
    http_req_duration: ['p(95)<500', 'p(99)<1000'],
    http_req_failed: ['rate<0.01'],
  },
}

const think = (min, max) => sleep(min + Math.random() * (max - min))

export default function () {
  const token = tokens[(__VU - 1) % tokens.length]
  const auth = { Authorization: `Bearer ${token}` }

  const feed = http.get(`${BASE_URL}/feed`, { tags: { name: 'GET /feed' } })
  const posts = feed.status === 200 ? feed.json('posts') : []
  check(feed, { 'feed: 200 with 20 posts': (r) => r.status === 200 && posts.length === 20 })
  think(3, 7)

  if (posts.length === 0) return think(5, 15)
  const id = posts[Math.floor(Math.random() * posts.length)].id
  const post = http.get(`${BASE_URL}/posts/${id}`, { tags: { name: 'GET /posts/:id' } })
  check(post, { 'post: 200, the one asked for': (r) => r.status === 200 && r.json('post.id') === id })
  think(3, 8)

  if (Math.random() < mix.like) {
    const like = http.post(`${BASE_URL}/posts/${id}/like`, null, {
      headers: auth,
      tags: { name: 'POST /posts/:id/like' },
    })
    check(like, { 'like: 201 or 200': (r) => r.status === 201 || r.status === 200 })
  }
  if (Math.random() < mix.write) {
    const body = JSON.stringify({ body: `Load test post from user ${__VU}, loop ${__ITER}.` })
    const created = http.post(`${BASE_URL}/posts`, body, {
      headers: { ...auth, 'Content-Type': 'application/json' },
      tags: { name: 'POST /posts' },
    })
    check(created, { 'create: 201': (r) => r.status === 201 })
  }
  think(5, 15)
}
