// A user and a token for it: what a new, empty database needs before the API takes a write (the
// challenge's seed writes tokens for its own users into tokens.json beside the database).
//
//   node --experimental-import-text token.ts <username> [days]     (days: 30 by default)
//
// It makes the user if there is none of that name, and prints the token. It reads SQLITE_PATH and
// JWT_SECRET as app.ts does: run it with the API's settings, while the API runs or not.
import { closeDatabase, database, openDatabase, signToken } from './app.ts'

const [username, days = '30'] = process.argv.slice(2)
if (!/^[\w.-]{1,64}$/.test(username ?? '') || !/^[1-9][0-9]{0,4}$/.test(days)) {
  console.error('usage: node --experimental-import-text token.ts <username: 1 to 64 of a-z A-Z 0-9 _ . -> [days]')
  process.exit(2)
}
if (!openDatabase()) {
  console.error('the database is busy: another connection holds its locks; try again')
  process.exit(1)
}
const db = database().connection
db.prepare('INSERT INTO users (username) VALUES (?) ON CONFLICT (username) DO NOTHING').run(username)
const { id } = db.prepare('SELECT id FROM users WHERE username = ?').get(username) as { id: number }
closeDatabase()
console.log(signToken({ id, username }, Number(days) * 86_400))
