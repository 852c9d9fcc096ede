// Functions for the test that the function-length rule is checked: too_long is 122 lines from
// its signature to its closing brace; the braces in its strings, characters and comments do not
// end it early, and short() around it stays within the limit.
namespace fixture {

int short_one() { return 1; }

int too_long(int x) {
  const char* open = "{{{";  // a string of braces: not code
  const char close = '}';    // a character: not code
  /* a comment } with a brace */
  if (x > 0) {
    x += open[0] + close;
  }
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
  x += 1;  // } not a brace
}

struct Table {
  int a = 0;
  int get() const { return a; }
};

}  // namespace fixture
