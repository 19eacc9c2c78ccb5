// Linked with one layer's whole archive and only the layers under it (CMakeLists.txt): the link fails when that
// layer refers to a symbol of a higher layer.
int main() { return 0; }
